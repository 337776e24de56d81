"""Measure the standing queue TCP keeps at an emulated port: the simulator's `queue_bytes` parameter.

    python -m geryon.sim.queueprobe [--flows 1,2,4,7,14] [--congestion bbr] [--bw 100mbit]
                                    [--duration 5] [--json]

Builds a small emulated cluster (the same HTB strict-priority ports and GSO setting as
`bench paper`), starts N bulk TCP flows into one host and samples the bytes queued in the
bottleneck port (`tc -s qdisc`, the root HTB's backlog) every 50 ms after a warm-up, and the bytes
each bulk connection has in flight (`ss -tin` in the senders' namespaces: unacked segments x MSS,
the part of a socket's backlog beyond TCP_NOTSENT_LOWAT that an urgent frame on the same
connection waits behind; compare.py adds it to the simulator's socket backlog). Two shapes:
`spread` -- the N flows come from different hosts and meet in the switch port into the sink (the
incast into a worker's down link); `one` -- all N leave one host and meet in its own egress
(a host's up link carrying its worker's pushes and its server's sends). The simulator's per-flow
queue (queues.py) is the mean backlog (what a frame arriving at a random time finds). Needs root;
the cluster is named `gyq<random>` and removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import uuid

_BACKLOG = re.compile(r"qdisc htb \S+ root.*?backlog (\d+)b (\d+)p", re.S)
_MSS = re.compile(r"\bmss:(\d+)")
_UNACKED = re.compile(r"\bunacked:(\d+)")


def _backlog(cluster, netns: str, dev: str) -> tuple[int, int]:
    out = subprocess.run(["ip", "netns", "exec", netns, "tc", "-s", "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, timeout=10).stdout
    match = _BACKLOG.search(out)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _inflight(netns: str, sink_ip: str, port: int) -> int:
    """Bytes in flight (unacked segments x MSS) summed over this namespace's connections to the sink."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-tinH", "state", "established",
                          "dst", f"{sink_ip}:{port}"], capture_output=True, text=True, timeout=10).stdout
    total = 0
    for line in out.splitlines():       # each connection's second line holds its tcp_info
        mss, unacked = _MSS.search(line), _UNACKED.search(line)
        if mss and unacked:
            total += int(mss.group(1)) * int(unacked.group(1))
    return total


def probe(flows: int, shape: str, congestion: str, bw: str, duration: float, senders: int = 4) -> dict:
    """Median and p90 backlog (bytes, packets) of the bottleneck port with `flows` bulk flows."""
    from geryon.emulate.cluster import EmulatedCluster
    from geryon.emulate.traffic import traffic_argv

    hosts = 1 + (senders if shape == "spread" else 1)
    name = "q" + uuid.uuid4().hex[:5]
    # every bulk sender sets its own TCP_CONGESTION; the namespaces keep their default (a namespace
    # may only default to an algorithm the host allows, which excludes cubic here)
    with EmulatedCluster(name, hosts=max(2, hosts), bw=bw, priority=True) as cluster:
        sink_host = cluster.hosts[0]
        sink = cluster.popen(sink_host, traffic_argv("sink", "--port", "5201"),
                             stdout=subprocess.PIPE, text=True)
        try:
            sink.stdout.readline()
            start_at = time.time() + 2.5 + 0.2 * flows   # every sender started (python import) by then
            procs = []
            for i in range(flows):
                host = cluster.hosts[1 + (i % senders if shape == "spread" else 0)]
                procs.append(cluster.popen(host, traffic_argv(
                    "bulk", sink_host.ip, "--port", "5201", "--duration", str(duration),
                    "--warmup", "0.5", "--congestion", congestion, "--start-at", str(start_at)),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if shape == "spread":
                netns, dev = cluster.switch_port(sink_host)
            else:
                netns, dev = cluster.hosts[1].netns, cluster.hosts[1].iface
            time.sleep(max(0.0, start_at - time.time()) + 1.5)
            sending = sorted({cluster.hosts[1 + (i % senders if shape == "spread" else 0)].netns
                              for i in range(flows)})
            samples, inflight = [], []
            end = start_at + duration - 0.3
            while time.time() < end:
                samples.append(_backlog(cluster, netns, dev))
                inflight.append(sum(_inflight(ns, sink_host.ip, 5201) for ns in sending))
                time.sleep(0.05)
            for proc in procs:
                proc.wait(timeout=duration + 30)
        finally:
            sink.terminate()
            sink.wait(timeout=10)
    byte_values = sorted(b for b, _ in samples) or [0]
    packet_values = sorted(p for _, p in samples) or [0]
    return {"flows": flows, "shape": shape, "congestion": congestion, "bw": bw,
            "samples": len(samples), "median_bytes": statistics.median(byte_values),
            "mean_bytes": statistics.fmean(byte_values),
            "p90_bytes": byte_values[int(0.9 * (len(byte_values) - 1))],
            "median_packets": statistics.median(packet_values),
            "per_flow_bytes": statistics.fmean(byte_values) / flows,
            "inflight_per_flow_bytes": statistics.fmean(inflight or [0]) / flows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geryon.sim.queueprobe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flows", default="1,2,4,7,14")
    parser.add_argument("--shape", default="spread,one")
    parser.add_argument("--congestion", default="bbr")
    parser.add_argument("--bw", default="100mbit", help="port rate(s), comma-separated")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for congestion, bw in ((c, b) for c in args.congestion.split(",") for b in args.bw.split(",")):
        args.bw = bw
        for shape in args.shape.split(","):
            for flows in (int(f) for f in args.flows.split(",")):
                row = probe(flows, shape, congestion, args.bw, args.duration)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"{args.bw:8} {congestion:6} {shape:6} {flows:3} flows: backlog mean "
                          f"{row['mean_bytes'] / 1e3:8.1f} KB, median "
                          f"{row['median_bytes'] / 1e3:8.1f} KB ({row['median_packets']:.0f} packets), "
                          f"p90 {row['p90_bytes'] / 1e3:8.1f} KB, per flow "
                          f"{row['per_flow_bytes'] / 1e3:6.1f} KB, in flight per flow "
                          f"{row['inflight_per_flow_bytes'] / 1e3:6.1f} KB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
