"""The emulated cluster on real namespaces: reachability, queues on every egress, records, cleanup."""

import json
import os
import signal
import sys

import pytest

from geryon import envvars
from geryon.emulate import EmulatedCluster, Host, clean
from geryon.emulate import fabric, state
from geryon.errors import ConfigError, EmulationError, NameInUse
from geryon.netconf import read_class_counters

pytestmark = pytest.mark.root

# ping without iputils: one ICMP echo per destination over a raw socket; exit 0 if all answered
PING = r"""
import os, socket, struct, sys, time
def checksum(data):
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
ident, missing = os.getpid() & 0xFFFF, []
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
for seq, dst in enumerate(sys.argv[1:], 1):
    body = struct.pack("!HH", ident, seq) + b"geryon!!"
    sock.sendto(struct.pack("!BBH", 8, 0, checksum(b"\x08\x00\x00\x00" + body)) + body, (dst, 0))
    deadline = time.monotonic() + 3
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            packet, (src, _) = sock.recvfrom(1500)
        except socket.timeout:
            missing.append(dst)
            break
        hlen = (packet[0] & 0x0F) * 4
        kind, _, _, pid, pseq = struct.unpack("!BBHHH", packet[hlen:hlen + 8])
        if kind == 0 and src == dst and (pid, pseq) == (ident, seq):
            break
print(" ".join(missing))
sys.exit(1 if missing else 0)
"""


def assert_all_pairs_reach(cluster):
    for host in cluster.hosts:
        others = [h.ip for h in cluster.hosts if h != host]
        result = cluster.run(host, [sys.executable, "-c", PING, *others], timeout=30,
                             capture_output=True, text=True)
        assert result.returncode == 0, f"{host.name} cannot reach {result.stdout.strip()} {result.stderr}"


def test_star_hosts_reach_each_other(unique_name):
    with EmulatedCluster(unique_name, hosts=3, bw="100mbit") as cluster:
        assert cluster.hosts[0] == Host("h1", f"gy{unique_name}-h1", "10.199.0.1", "eth0")
        assert_all_pairs_reach(cluster)
        # every host sees exactly lo + eth0 with its address
        out = cluster.run("h2", ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        assert "eth0" in out and "10.199.0.2/16" in out and "127.0.0.1" in out
    assert not fabric.list_netns(f"gy{unique_name}-")


def test_leafspine_hosts_reach_each_other(unique_name):
    with EmulatedCluster(unique_name, hosts=4, bw="100mbit", topology="leafspine") as cluster:
        assert cluster.switch_port("h1") == (f"gy{unique_name}-l1", "h1")
        assert cluster.switch_port("h2") == (f"gy{unique_name}-l2", "h2")
        assert_all_pairs_reach(cluster)
        uplink = cluster.describe()["uplink_rate"]
        assert uplink == 100_000_000  # 2 hosts per leaf, 2:1 oversubscribed
    assert not fabric.list_netns(f"gy{unique_name}-")


def egress_ports(cluster):
    return [(end["netns"], end["dev"]) for link in cluster.describe()["links"] for end in (link["a"], link["b"])]


def test_priority_queues_on_every_egress(unique_name):
    with EmulatedCluster(unique_name, hosts=3, bw="100mbit", classes="high:46,mid:26,low:0",
                         topology="leafspine") as cluster:
        ports = egress_ports(cluster)
        assert len(ports) == 2 * (3 + 2)
        for netns, dev in ports:
            counters = read_class_counters(dev, netns=netns)
            assert sorted(c.dscp for c in counters) == [0, 26, 46], (netns, dev)


def test_no_priority_means_shaping_only(unique_name):
    with EmulatedCluster(unique_name, hosts=2, bw="50mbit", priority=False) as cluster:
        for netns, dev in egress_ports(cluster):
            assert len(read_class_counters(dev, netns=netns)) <= 1, (netns, dev)
            qdiscs = cluster.run("h1", ["tc", "-n", netns, "qdisc", "show", "dev", dev],
                                 capture_output=True, text=True).stdout
            assert "htb" in qdiscs
        assert cluster.describe()["queues"] == "shaping"


@pytest.mark.parametrize("offload, segments", [(True, 65535), (False, 1)])
def test_offload_switch_sets_gso_segments(unique_name, offload, segments):
    from pyroute2 import IPRoute
    with EmulatedCluster(unique_name, hosts=2, offload=offload) as cluster:
        for netns, dev in egress_ports(cluster):
            with IPRoute(netns=netns) as ipr:
                link = ipr.link("get", ifname=dev)[0]
                assert link.get("IFLA_GSO_MAX_SEGS") == segments, (netns, dev)
        assert cluster.describe()["offload"] is offload


def test_exception_inside_with_block_removes_everything(unique_name):
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(unique_name, hosts=3) as cluster:
            cluster.popen("h1", ["sleep", "60"])  # a process left behind must not keep anything alive
            assert len(fabric.list_netns(f"gy{unique_name}-")) == 4
            raise RuntimeError("boom")
    assert not fabric.list_netns(f"gy{unique_name}-")
    assert not state.record_exists(unique_name)


def test_failed_build_removes_partial_state(unique_name, monkeypatch):
    def broken_queues(self):
        raise RuntimeError("tc exploded")

    monkeypatch.setattr(EmulatedCluster, "_install_queues", broken_queues)
    with pytest.raises(RuntimeError, match="tc exploded"):
        EmulatedCluster(unique_name, hosts=3).up()
    assert not fabric.list_netns(f"gy{unique_name}-")
    assert not state.record_exists(unique_name)


def test_an_interrupt_while_building_leaves_nothing_behind(unique_name, monkeypatch):
    """Ctrl-C (or the SIGTERM a geryon command takes as one) in the last step of the build: the build
    ends whole, the interrupt is raised as `with` would start, and the cluster is removed all the same."""
    write_record = state.write_record

    def interrupted_write(name, record):
        os.kill(os.getpid(), signal.SIGINT)
        write_record(name, record)

    monkeypatch.setattr(state, "write_record", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        with EmulatedCluster(unique_name, hosts=2):
            pytest.fail("the block ran although the build was interrupted")
    assert not fabric.list_netns(f"gy{unique_name}-")
    assert not state.record_exists(unique_name)


def test_an_interrupt_while_removing_is_taken_after_the_removal(unique_name, monkeypatch):
    remove_namespaces = fabric.remove_namespaces

    def interrupted_removal(names):
        os.kill(os.getpid(), signal.SIGINT)
        remove_namespaces(names)

    cluster = EmulatedCluster(unique_name, hosts=2).up()
    monkeypatch.setattr(fabric, "remove_namespaces", interrupted_removal)
    with pytest.raises(KeyboardInterrupt):
        cluster.down()
    assert not fabric.list_netns(f"gy{unique_name}-")
    assert not state.record_exists(unique_name)


def test_state_record_and_name_in_use(unique_name):
    cluster = EmulatedCluster(unique_name, hosts=2, bw="10mbit", tcp_congestion="reno")
    try:
        cluster.up()
        record = json.loads(state.record_path(unique_name).read_text())
        assert record["state"] == "up" and record["rate"] == 10_000_000
        assert record["tcp_congestion"] == "reno" and cluster.congestion_control("h1") == "reno"
        assert [h["netns"] for h in record["hosts"]] == [f"gy{unique_name}-h1", f"gy{unique_name}-h2"]
        intruder = EmulatedCluster(unique_name, hosts=2)
        with pytest.raises(NameInUse, match="already exists"):
            intruder.up()
        intruder.down()  # never held the name: must leave the running cluster alone
        assert len(fabric.list_netns(f"gy{unique_name}-")) == 3 and state.record_exists(unique_name)
        again = EmulatedCluster.from_record(unique_name)
        assert again.hosts == cluster.hosts
        assert again.run("h1", ["true"]).returncode == 0
        again.down()
        assert not fabric.list_netns(f"gy{unique_name}-")
    finally:
        cluster.down()
    assert not state.record_exists(unique_name)


def test_leftover_namespace_blocks_the_name(unique_name):
    from pyroute2 import netns
    netns.create(f"gy{unique_name}-h9")
    try:
        with pytest.raises(NameInUse, match="clean --name"):
            EmulatedCluster(unique_name, hosts=2).up()
        assert fabric.list_netns(f"gy{unique_name}-") == [f"gy{unique_name}-h9"]  # not ours to remove
    finally:
        clean(name=unique_name)
    assert not fabric.list_netns(f"gy{unique_name}-")


def test_state_dir_is_overridable(unique_name, tmp_path, monkeypatch):
    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path))
    with EmulatedCluster(unique_name, hosts=2):
        assert (tmp_path / "clusters" / f"{unique_name}.json").exists()
    assert not os.listdir(tmp_path / "clusters")


def test_unknown_host_is_a_clear_error(unique_name):
    with EmulatedCluster(unique_name, hosts=2) as cluster:
        with pytest.raises(ConfigError, match="no host 'h7'"):
            cluster.run("h7", ["true"])


def test_a_congestion_control_a_namespace_may_not_default_to_is_a_clear_error(unique_name):
    allowed = open("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read().split()
    available = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    restricted = [cc for cc in available if cc not in allowed]
    if not restricted:
        pytest.skip("every available congestion control is allowed in namespaces here")
    cluster = EmulatedCluster(unique_name, hosts=2, bw="10mbit", tcp_congestion=restricted[0])
    with pytest.raises(EmulationError, match="allowed"):
        cluster.up()
    assert not fabric.list_netns(f"gy{unique_name}-")
