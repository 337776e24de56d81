"""Hostfile parsing and placement of servers and workers on its hosts."""

import pytest

from geryon.errors import ConfigError
from geryon.launch.config import LaunchConfig
from geryon.launch.hostfile import HostSpec, parse_hostfile_text
from geryon.launch.placement import place_by_hostfile, place_one_per_host


def test_lines_options_comments():
    hosts = parse_hostfile_text("""
        # the cluster
        node1
        node2:2222 slots=4 user=alice key=/k iface=eth1 python=/opt/py  # trailing comment
        [::1]:2200 slots=2
    """)
    assert hosts[0] == HostSpec("node1")
    assert hosts[1] == HostSpec("node2", 2222, 4, "alice", "/k", "eth1", "/opt/py")
    assert (hosts[2].host, hosts[2].port, hosts[2].address) == ("::1", 2200, "[::1]:2200")
    assert hosts[1].known_hosts_name == "[node2]:2222" and hosts[0].known_hosts_name == "node1"


@pytest.mark.parametrize("text, message", [
    ("node1 slots=0", "slots='0' must be a positive integer"),
    ("node1 slots", "bad entry 'slots'"),
    ("node1:99999", "bad port"),
    ("node1:ssh", "bad port"),
    ("slots=2", "must start with a host name"),
    ("node1\nnode1", "already listed on line 1"),
    ("node1 user=a user=b", "given twice"),
    ("# nothing\n", "lists no hosts"),
])
def test_bad_lines(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_hostfile_text(text, origin="hf")


def test_placement_servers_one_per_host_workers_by_slots():
    hosts = parse_hostfile_text("a slots=2\nb slots=1\nc slots=3")
    config = LaunchConfig(script="/x.py", mode="ps", workers=5, servers=2, backend="ssh", hosts=hosts)
    placed = {spec.name: (spec.host, spec.local_rank) for spec in place_by_hostfile(config)}
    assert placed == {"worker0": (0, 0), "worker1": (0, 1), "worker2": (1, 0), "worker3": (2, 0),
                      "worker4": (2, 1), "server0": (0, 0), "server1": (1, 0)}


def test_emulated_placement_one_rank_per_host():
    config = LaunchConfig(script="/x.py", mode="ps", workers=3, servers=2, backend="emulate")
    assert [(s.name, s.host) for s in place_one_per_host(config)] == [
        ("worker0", 0), ("worker1", 1), ("worker2", 2), ("server0", 3), ("server1", 4)]
