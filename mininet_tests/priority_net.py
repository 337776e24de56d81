"""The priority check on a Mininet network: LinuxBridge switch, TCLink with bw, no controller.

Three hosts behind one Linux bridge; every link is a TCLink shaped at `bw` (HTB, Mininet's own); the
switch's egress ports then get geryon's priority queues (`install_priority_queues`, replacing the
TCLink root qdisc) unless priority is off. Two senders (DSCP high, DSCP low) load the port toward the
third host, with geryon's traffic tool (`geryon.emulate.traffic`) run inside Mininet's hosts.

Mininet puts the bridge and its ports in the root namespace; the only root-namespace interfaces this
module touches are the switch ports Mininet created for this network (`gy<tag>s1-eth<i>`), never
eth0 or lo. Node names carry a unique tag so that parallel runs never collide, and the network is
always stopped (`net.stop()` removes its links, bridge and host shells); nothing here runs `mn -c`.
Mininet.init() is skipped on purpose: its fixLimits() rewrites machine-wide sysctls (tcp_rmem, ...).

Run it alone to print the numbers: `python mininet_tests/priority_net.py [--no-priority] [--cc cubic]`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager

from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.nodelib import LinuxBridge

from geryon.childproc import ChildProcess
from geryon.emulate.check import traffic_result
from geryon.errors import EmulationError
from geryon.emulate.traffic import traffic_argv
from geryon.netconf import default_classes, install_priority_queues, read_class_counters, remove_queues

SINK_PORT = 5201
START_MARGIN_S = 1.0


@contextmanager
def priority_network(bw_mbit: float = 100, priority: bool = True, tag: str | None = None):
    """A started 3-host Mininet network; yields (net, switch port names); always stopped."""
    if os.geteuid() != 0:
        raise PermissionError("Mininet needs root")
    tag = tag or uuid.uuid4().hex[:4]
    setLogLevel("error")
    Mininet.inited = True  # skip Mininet.init(): fixLimits() would change machine-wide sysctls
    net = Mininet(topo=None, switch=LinuxBridge, controller=None, link=TCLink, build=False)
    queued = []
    try:
        switch = net.addSwitch(f"gy{tag}s1", dpid="1")
        hosts = [net.addHost(f"gy{tag}h{i}") for i in (1, 2, 3)]
        for host in hosts:
            net.addLink(host, switch, bw=bw_mbit)
        net.build()
        net.start()
        # the switch-side interface of each link is that host's bottleneck egress
        ports = {host.name: link.intf2.name if link.intf2.node is switch else link.intf1.name
                 for host, link in zip(hosts, net.links)}
        if priority:
            for dev in ports.values():
                install_priority_queues(dev, classes=default_classes(2), rate=int(bw_mbit * 1e6))
                queued.append(dev)
        yield net, ports
    finally:
        try:
            for dev in queued:  # also forgets geryon's class-name sidecar for the device
                remove_queues(dev)
        finally:
            net.stop()


def _start(host, *argv: str) -> ChildProcess:
    """A traffic process in a Mininet host (Mininet's own popen enters the host), read as geryon's
    other children are: JSON lines on stdout, stderr kept for the error message."""
    stderr = tempfile.TemporaryFile("a+")
    process = host.popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                         text=True, bufsize=1)
    return ChildProcess(process, f"traffic {argv[3] if len(argv) > 3 else ''} on {host.name}", EmulationError,
                        stderr)


def _counters(dev: str) -> list[dict]:
    return [c.as_dict() for c in read_class_counters(dev)]


def run_contention(bw_mbit: float = 100, priority: bool = True, congestion: str = "bbr",
                   duration: float = 4.0, warmup: float = 1.0, burst_bytes: int = 5_000_000,
                   burst_repeat: int = 3) -> dict:
    """Two long flows (high from h1, low from h2) into h3, then a burst alone and against a low flow."""
    classes = default_classes(2)
    high, low = classes[0].dscp, classes[-1].dscp
    with priority_network(bw_mbit, priority) as (net, ports):
        h1, h2, h3 = net.hosts
        bottleneck = ports[h3.name]
        sink = _start(h3, *traffic_argv("sink", "--port", str(SINK_PORT)))
        try:
            sink.next_line(30)  # the sink says it listens

            def sender(host, mode, dscp, *options):
                return _start(host, *traffic_argv(mode, h3.IP(), "--port", str(SINK_PORT), "--dscp", str(dscp),
                                                  "--congestion", congestion, *options))

            burst_args = ("--bytes", str(burst_bytes), "--repeat", str(burst_repeat))
            alone = traffic_result(sender(h1, "burst", high, *burst_args), 60)

            start = repr(time.time() + START_MARGIN_S)
            timing = ("--duration", str(duration), "--warmup", str(warmup), "--start-at", start)
            flows = [sender(h1, "bulk", high, *timing), sender(h2, "bulk", low, *timing)]
            high_flow, low_flow = (traffic_result(f, duration + 30) for f in flows)
            counters = _counters(bottleneck)
            time.sleep(0.5)  # let the port's queues drain

            start = time.time() + START_MARGIN_S
            background = sender(h2, "bulk", low, "--duration", "600", "--start-at", repr(start))
            try:
                contended = traffic_result(sender(h1, "burst", high, *burst_args, "--start-at", repr(start + 1.0)), 60)
            finally:
                background.close()
        finally:
            sink.close()
    total = high_flow["throughput_bps"] + low_flow["throughput_bps"]
    return {
        "bw_mbit": bw_mbit, "priority": priority, "congestion": congestion, "bottleneck": bottleneck,
        "high_bps": high_flow["throughput_bps"], "low_bps": low_flow["throughput_bps"],
        "high_share": high_flow["throughput_bps"] / total if total else 0.0,
        "burst_alone_s": alone["median_s"], "burst_contended_s": contended["median_s"],
        "burst_ratio": contended["median_s"] / alone["median_s"], "counters": counters,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bw", type=float, default=100, help="link rate in Mbit/s")
    parser.add_argument("--no-priority", action="store_true")
    parser.add_argument("--cc", default="bbr")
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()
    print(json.dumps(run_contention(args.bw, not args.no_priority, args.cc, args.duration), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
