"""Machine-wide CPU per GB moved by iperf3 h1 -> h2 through the emulated 2-host star, HTB buckets as built or resized.

    python docs/data/linerate/lead19-htb-cpu.py BW BURST SECONDS    # e.g. 1gbit 1600 8

BURST as in lead18-htb-iperf3.py ("default" keeps geryon's buckets, anything else is set with `tc class change`).
Besides the goodput it reads /proc/stat before and after the transfer (every CPU: user, system, softirq, ...)
and iperf3's own CPU accounting of its sender and receiver processes, and prints one JSON line with CPU
seconds per GB received: machine-wide busy, by kind, and the two iperf3 processes' own. If the larger buckets
only move work from the timer softirq into the sender's sendmsg, the processes' share rises and the
machine-wide figure does not.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from geryon.emulate.cluster import EmulatedCluster

_spec = importlib.util.spec_from_file_location("lead18", Path(__file__).with_name("lead18-htb-iperf3.py"))
lead18 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lead18)

KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[str, float]:
    """Seconds spent by all CPUs together in each /proc/stat kind since boot."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(KINDS)]
    return {kind: int(value) / TICK for kind, value in zip(KINDS, fields)}


def main() -> None:
    bw, burst, secs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    name = "gyhc"
    cluster = EmulatedCluster(name, hosts=2, bw=bw, tcp_congestion="reno").up()
    server = None
    try:
        if burst != "default":
            lead18.resize_buckets(name, burst)
        h1, h2 = cluster.hosts[0], cluster.hosts[1]
        server = subprocess.Popen(["ip", "netns", "exec", h2.netns, "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        before, began = cpu_seconds(), time.monotonic()
        report = json.loads(lead18.output("ip", "netns", "exec", h1.netns, "iperf3", "-c", h2.ip, "-t", str(secs),
                                          "-J", "-C", "reno"))
        after, wall = cpu_seconds(), time.monotonic() - began
        received = report["end"]["sum_received"]["bytes"]
        gb = received / 1e9
        spent = {kind: after[kind] - before[kind] for kind in KINDS}
        busy = sum(v for k, v in spent.items() if k not in ("idle", "iowait"))
        util = report["end"]["cpu_utilization_percent"]
        print(json.dumps({
            "bw": bw, "burst": burst, "seconds": secs, "wall_s": round(wall, 2),
            "goodput_mbit": round(report["end"]["sum_received"]["bits_per_second"] / 1e6, 3),
            "gb": round(gb, 4),
            "machine_busy_s_per_gb": round(busy / gb, 3),
            "machine_s_per_gb": {k: round(v / gb, 3) for k, v in spent.items() if k not in ("idle", "iowait")},
            # iperf3 reports each side's process CPU (user+system) as % of its own run time
            "iperf3_sender_s_per_gb": round(util["host_total"] / 100 * secs / gb, 3),
            "iperf3_receiver_s_per_gb": round(util["remote_total"] / 100 * secs / gb, 3),
            "loadavg": os.getloadavg()[0],
        }))
    finally:
        if server:
            server.kill()
        cluster.down()


if __name__ == "__main__":
    main()
