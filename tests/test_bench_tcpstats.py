"""The benchmarks' counters say where packets were dropped: UDP from two emulated hosts into a third
(each sender faster than its own port, the two together twice the receiver's) is dropped in the
senders' egress queues and in the switch port toward the receiver, and `tcpstats.counted` says so."""

import json
import subprocess
import sys

import pytest

from geryon.bench import tcpstats
from geryon.emulate import EmulatedCluster
from geryon.errors import EmulationError, InterfaceNotFound

BLAST = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 16 << 20)   # SO_SNDBUFFORCE: more than the queue holds
end, payload = time.monotonic() + float(sys.argv[2]), bytes(1400)
while time.monotonic() < end:
    try:
        s.sendto(payload, (sys.argv[1], 9))
    except OSError:          # ENOBUFS: the host's own queue is full
        pass
"""


def test_softnet_drops_sum_the_second_column_of_every_cpu():
    text = "0000a1b2 00000003 00000000 00\n0000c3d4 00000010 00000001 00\n"
    assert tcpstats.parse_softnet_drops(text) == 3 + 16
    with pytest.raises(EmulationError, match="softnet_stat"):
        tcpstats.parse_softnet_drops("garbage\n")
    assert tcpstats.softnet_drops() >= 0


@pytest.mark.root
def test_counted_names_the_queues_that_dropped(unique_name):
    with EmulatedCluster(unique_name, hosts=3, bw="10mbit") as cluster:
        target = cluster.host("h2").ip

        def blast():
            senders = [cluster.popen(h, [sys.executable, "-c", BLAST, target, "2"]) for h in ("h1", "h3")]
            return [p.wait(timeout=30) for p in senders]

        counted = tcpstats.counted(cluster, ["h1", "h2", "h3"], blast)
        for name in ("h1", "h2"):   # a link's drops are what iproute2 reports for it
            host, (switch_netns, switch_dev) = cluster.host(name), cluster.switch_port(name)
            for netns, dev in ((host.netns, host.iface), (switch_netns, switch_dev)):
                assert tcpstats.link_drops(dev, netns) == _iproute2_drops(dev, netns)
        with pytest.raises(InterfaceNotFound, match="nosuchdev"):   # a missing device is named
            tcpstats.link_drops("nosuchdev", cluster.host("h1").netns)
    assert counted.result == [0, 0]
    drops = counted.per_host
    # each sender offered far more than its 10 Mbit/s port: its own queue dropped the rest
    assert drops["h1"]["host_queue_drops"] > 0 and drops["h3"]["host_queue_drops"] > 0
    # the two shaped streams (20 Mbit/s) met at h2's 10 Mbit/s port: the switch dropped there, nowhere else
    assert drops["h2"]["switch_port_drops"] > 0
    assert drops["h1"]["switch_port_drops"] == drops["h3"]["switch_port_drops"] == 0
    assert drops["h2"]["host_queue_drops"] == 0 and counted.softnet_drops >= 0
    nowhere_else = ("host_link_drops", "switch_link_drops", "ip_in_discards", "backlog_drops", "rcvq_drops",
                    "ofo_drops", "ofo_pruned", "rcv_pruned", "zero_window_drops")
    assert all(c[where] == 0 for c in drops.values() for where in nowhere_else)


def _iproute2_drops(dev: str, netns: str) -> int:
    shown = json.loads(subprocess.run(["ip", "-n", netns, "-s", "-j", "link", "show", "dev", dev], check=True,
                                      capture_output=True, text=True).stdout)[0]["stats64"]
    return shown["rx"]["dropped"] + shown["tx"]["dropped"]
