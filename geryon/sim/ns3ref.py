"""Packet-level reference for the fluid model: the same traffic in ns-3 (optional extra `[ns3]`).

    python -m geryon.sim.ns3ref --hosts 8,16,32,64 [--rate-mbit 100] [--high-kb 64 --low-kb 256]

The pattern is the push phase of a colocated synchronous PS: every host sends to every other host
one high-class flow (the urgent slices) and one low-class flow (the bulk), all starting together.
ns-3 builds a star (one switch node, point-to-point links), a PrioQueueDisc on every egress (host and
switch; installed before addresses, else ns-3 installs FqCoDel), TCP BulkSend with `Tos` 0xb8 for the
high class under `geryon` and 0 for both under `endhost` (one network class). The fluid model
(fabric.allocate with one group per connection) runs the same flows at the links' payload rate
(ns-3's TCP segments carry 1448 bytes in 1502 counted by a point-to-point link: IPv4, TCP with
timestamps and a 2-byte PPP header). Compared: the completion time of the high class (the last high
flow to finish) and of everything (the phase).

ns-3 comes from PyPI (`pip install geryon[ns3]`, i.e. ns3==3.44.post0; ~2.5 min, ~520 MB); its
import takes 10-60 s.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from geryon.errors import ConfigError
from geryon.sim.fabric import GroupSet, allocate, build_fabric
from geryon.sim.scenario import payload_rate

PRIOMAP = "1 1 1 1 0 1 0 0 1 1 1 1 1 1 1 1"   # TOS 0xb8 -> socket priority 4 -> band 0
HIGH_TOS = 0xB8
PORTS = (9000, 9001)   # sink port per class
P2P_FRAME_BYTES = 2    # what an ns-3 point-to-point link counts beyond the IP packet (PPP header)


def fluid_phase(hosts: int, rate_bps: float, high_bytes: int, low_bytes: int, priority: bool) -> dict:
    """Completion times (s) of the all-to-all two-class phase in the fluid model."""
    fabric = build_fabric(hosts, hosts, "colocated", payload_rate(rate_bps, frame_bytes=P2P_FRAME_BYTES))
    src, dst, cls, size = [], [], [], []
    for s in range(hosts):
        for d in range(hosts):
            if s != d:
                for klass, nbytes in ((0, high_bytes), (1, low_bytes)):
                    src.append(s), dst.append(d), cls.append(klass if priority else 0), size.append(nbytes)
                    # remember the real class for the report, even without network priority
    real_class = np.tile([0, 1], len(src) // 2)
    groups = GroupSet(fabric, host=np.array(dst), pull=np.zeros(len(dst), dtype=bool),
                      cls=np.array(cls), worker_host=np.array(src))
    remaining = np.array(size, dtype=float)
    done = np.full(len(size), math.nan)
    now = 0.0
    active = np.flatnonzero(remaining > 0)
    while len(active):
        rates = allocate(groups, active)
        with np.errstate(divide="ignore"):
            step = float((remaining[active] / rates).min())
        remaining[active] -= rates * step
        now += step
        finished = active[remaining[active] <= 1e-9 * max(size)]
        done[finished] = now
        active = np.setdiff1d(active, finished)
    return {"high_s": float(np.nanmax(done[real_class == 0])), "all_s": float(np.nanmax(done)),
            "high_mean_s": float(np.nanmean(done[real_class == 0]))}


def ns3_phase(hosts: int, rate_bps: float, high_bytes: int, low_bytes: int, priority: bool,
              delay_us: float = 10.0, stop_s: float = 60.0) -> dict:
    """The same phase in ns-3; completion = last byte received at the sink, from the start."""
    try:
        from ns import ns
    except ImportError:
        raise ConfigError("ns-3 is not installed: pip install 'geryon[ns3]' (ns3==3.44.post0)") from None
    ns.Config.SetDefault("ns3::TcpSocket::SegmentSize", ns.UintegerValue(1448))
    ns.Config.SetDefault("ns3::TcpSocket::SndBufSize", ns.UintegerValue(1 << 20))
    ns.Config.SetDefault("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(1 << 20))
    nodes = ns.NodeContainer()
    nodes.Create(hosts + 1)
    switch = nodes.Get(hosts)
    p2p = ns.PointToPointHelper()
    p2p.SetDeviceAttribute("DataRate", ns.StringValue(f"{int(rate_bps)}bps"))
    p2p.SetChannelAttribute("Delay", ns.StringValue(f"{delay_us}us"))
    p2p.SetQueue("ns3::DropTailQueue", "MaxSize", ns.StringValue("4p"))
    ns.InternetStackHelper().Install(nodes)
    tch = ns.TrafficControlHelper()
    root = tch.SetRootQueueDisc("ns3::PrioQueueDisc", "Priomap", ns.StringValue(PRIOMAP))
    classes = tch.AddQueueDiscClasses(root, 2, "ns3::QueueDiscClass")
    for band in range(2):
        tch.AddChildQueueDisc(root, classes[band], "ns3::FifoQueueDisc", "MaxSize", ns.StringValue("1000p"))
    address = ns.Ipv4AddressHelper()
    host_addr = []
    for h in range(hosts):
        pair = ns.NodeContainer()
        pair.Add(nodes.Get(h))
        pair.Add(switch)
        devices = p2p.Install(pair)
        tch.Install(devices)                       # before addresses: else FqCoDel
        address.SetBase(ns.Ipv4Address(f"10.{1 + h // 250}.{h % 250}.0"), ns.Ipv4Mask("255.255.255.0"))
        interfaces = address.Assign(devices)
        host_addr.append(interfaces.GetAddress(0))
    ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()
    start = 0.1
    for h in range(hosts):
        for port in PORTS:
            sink = ns.PacketSinkHelper("ns3::TcpSocketFactory",
                                       ns.InetSocketAddress(ns.Ipv4Address.GetAny(), port).ConvertTo())
            sink.Install(nodes.Get(h)).Start(ns.Seconds(0.0))
    for s in range(hosts):
        for d in range(hosts):
            if s == d:
                continue
            for klass, nbytes in ((0, high_bytes), (1, low_bytes)):
                bulk = ns.BulkSendHelper("ns3::TcpSocketFactory",
                                         ns.InetSocketAddress(host_addr[d], PORTS[klass]).ConvertTo())
                bulk.SetAttribute("MaxBytes", ns.UintegerValue(nbytes))
                bulk.SetAttribute("Tos", ns.UintegerValue(HIGH_TOS if priority and klass == 0 else 0))
                bulk.Install(nodes.Get(s)).Start(ns.Seconds(start))
    monitor_helper = ns.FlowMonitorHelper()
    monitor = monitor_helper.InstallAll()
    ns.Simulator.Stop(ns.Seconds(stop_s))
    wall = time.perf_counter()
    ns.Simulator.Run()
    wall = time.perf_counter() - wall
    classifier = ns.DynamicCast[ns.Ipv4FlowClassifier](monitor_helper.GetClassifier())
    finish = {0: [], 1: []}
    for item in monitor.GetFlowStats():
        five = classifier.FindFlow(item.first)
        if five.destinationPort not in PORTS:
            continue   # ACK direction
        stats = item.second
        finish[PORTS.index(five.destinationPort)].append(stats.timeLastRxPacket.GetSeconds() - start)
    ns.Simulator.Destroy()
    expected = hosts * (hosts - 1)
    if len(finish[0]) != expected or len(finish[1]) != expected:
        raise RuntimeError(f"ns-3 saw {len(finish[0])}+{len(finish[1])} flows, expected {expected} each")
    return {"high_s": max(finish[0]), "all_s": max(finish[0] + finish[1]),
            "high_mean_s": sum(finish[0]) / len(finish[0]), "wall_s": wall}


def compare_phase(hosts: int, rate_bps: float, high_bytes: int, low_bytes: int, priority: bool) -> dict:
    fluid = fluid_phase(hosts, rate_bps, high_bytes, low_bytes, priority)
    packet = ns3_phase(hosts, rate_bps, high_bytes, low_bytes, priority)
    return {"hosts": hosts, "policy": "geryon" if priority else "endhost", "fluid": fluid, "ns3": packet,
            "error": {k: fluid[k] / packet[k] - 1 for k in fluid}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8,16,32,64")
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--high-kb", type=int, default=64)
    parser.add_argument("--low-kb", type=int, default=256)
    args = parser.parse_args(argv)
    for hosts in (int(h) for h in args.hosts.split(",")):
        for priority in (True, False):
            row = compare_phase(hosts, args.rate_mbit * 1e6, args.high_kb * 1024, args.low_kb * 1024, priority)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
