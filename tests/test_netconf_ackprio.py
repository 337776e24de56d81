"""Pure-ACK priority: TCP pure ACKs matched by u32 into the top class, ahead of the DSCP filters.

The plan as data (commands, prefs, canonical lines), then on a real veth pair: the filters exist, the ACKs of a
real low-class TCP transfer going the other way land in the top class, and the state read back from tc
verifies against the plan and restores byte for byte (the apply/rollback path of geryon.netconf.linuxapply).
"""

import subprocess

import pytest

from geryon.errors import ConfigError, RateError
from geryon.netconf import AckFilterOp, Capabilities, FilterOp, build_priority_plan, install_priority_queues
from geryon.netconf.plan import pyroute2_keys
from geryon.netconf.tcstate import parse_state, plan_canonical, read_state
from netconf_pair import send_tcp, wait_for

IPV4_ACK = ("match ip protocol 6 0xff match u8 0x05 0x0f at 0 match u16 0x0000 0xff80 at 2 "
            "match u8 0x10 0x3f at 33")


def test_ack_filters_come_first_and_move_the_dscp_filters_after_them():
    plan = build_priority_plan("eth0", 3, "100mbit", ack_priority="top")
    filters = [op for op in plan.ops if isinstance(op, (AckFilterOp, FilterOp))]
    assert [(type(op).__name__, op.protocol, op.pref) for op in filters] == [
        ("AckFilterOp", "ip", 1), ("AckFilterOp", "ipv6", 2),
        ("FilterOp", "ip", 3), ("FilterOp", "ip", 3), ("FilterOp", "ipv6", 4), ("FilterOp", "ipv6", 4)]
    assert all(op.flowid == "1:10" for op in filters[:2])  # the top class
    commands = plan.commands()
    assert f"tc filter add dev eth0 parent 1: protocol ip pref 1 u32 {IPV4_ACK} flowid 1:10" in commands
    assert ("tc filter add dev eth0 parent 1: protocol ipv6 pref 2 u32 match ip6 protocol 6 0xff "
            "match u16 0x0000 0xffc0 at 4 match u8 0x10 0x3f at 53 flowid 1:10") in commands
    assert ("filter 1: ip pref 1 u32 05000000/0f00ff80 at 0 00060000/00ff0000 at 8 00100000/003f0000 at 32 "
            "flowid 1:10") in plan_canonical(plan)


def test_own_mode_adds_an_ack_class_above_every_priority_class():
    plan = build_priority_plan("eth0", 2, "100mbit", ack_priority=True)  # True: the default mode, "own"
    assert plan.class_ids == ("1:10", "1:11")  # the priority classes keep their ids
    commands = plan.commands()
    rates = (("1:f", "5mbit", 0, 2225), ("1:10", "94mbit", 1, 13350), ("1:11", "1mbit", 2, 1725))
    assert commands[2:5] == [f"tc class add dev eth0 parent 1:1 classid {classid} htb rate {rate} ceil 100mbit "
                             f"prio {prio} quantum 15140 burst {burst} cburst 14100"
                             for classid, rate, prio, burst in rates]
    assert "tc qdisc add dev eth0 parent 1:f handle f: pfifo limit 1000" in commands
    assert [op.flowid for op in plan.ops if isinstance(op, AckFilterOp)] == ["1:f", "1:f"]
    lone = build_priority_plan("eth0", "only:0", "100mbit", ack_priority="own")  # one class: ACKs still above it
    assert [op.flowid for op in lone.ops if isinstance(op, AckFilterOp)] == ["1:f", "1:f"]


def test_without_the_option_or_a_class_above_the_default_there_is_no_ack_filter():
    assert build_priority_plan("eth0", 2, "100mbit").commands() == \
        build_priority_plan("eth0", 2, "100mbit", ack_priority="off").commands()
    lone = build_priority_plan("eth0", "only:0", "100mbit", ack_priority="top")
    assert not [op for op in lone.ops if isinstance(op, (AckFilterOp, FilterOp))]
    with pytest.raises(ConfigError, match="off, top, own"):
        build_priority_plan("eth0", 2, "100mbit", ack_priority="first")
    with pytest.raises(RateError, match="too low for a pure-ACK class"):
        build_priority_plan("eth0", "only:0", "8kbit", ack_priority="own")


def test_unshaped_plans_keep_the_ack_filter_with_u32_and_say_why_not_with_flower():
    prio_u32 = build_priority_plan("eth0", 2, None, Capabilities(frozenset({"prio"}), frozenset({"u32"})),
                                   ack_priority="own")
    assert [op.flowid for op in prio_u32.ops if isinstance(op, AckFilterOp)] == ["1:1", "1:1"]  # no band above
    assert any("top band" in note for note in prio_u32.notes)
    flower = build_priority_plan("eth0", 2, None, Capabilities(frozenset({"ets"}), frozenset({"flower"})),
                                 ack_priority=True)
    assert not [op for op in flower.ops if isinstance(op, AckFilterOp)]
    assert any("pure-ACK" in note for note in flower.notes)


def test_pyroute2_keys_are_single_bytes_where_they_belong():
    assert pyroute2_keys([(0x05000000, 0x0F00FF80, 0), (0x00060000, 0x00FF0000, 8)]) == [
        "0x05/0x0f+0", "0x00/0xff+2", "0x00/0x80+3", "0x06/0xff+9"]


def test_a_multi_key_filter_parses_from_the_text_dump_and_old_records_still_load():
    text = ('[{"kind":"htb","handle":"1:","root":true,"options":{"default":"0x11"}}]\n----geryon----\n'
            "\n----geryon----\n"
            "filter parent 1: protocol ip pref 1 u32 chain 0 \n"
            "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 \n"
            "filter parent 1: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:10 "
            "not_in_hw \n  match 05000000/0f00ff80 at 0\n  match 06000000/ff000000 at 9\n"
            "  match 10000000/3f000000 at 33\n")
    state = parse_state("eth0", text)
    assert state.filters[0]["keys"] == [{"value": 0x05000000, "mask": 0x0F00FF80, "off": 0},
                                        {"value": 0x06000000, "mask": 0xFF000000, "off": 9},
                                        {"value": 0x10000000, "mask": 0x3F000000, "off": 33}]
    restore = state.restore_commands("/opt/py")[-1]
    assert restore.startswith("/opt/py -c ") and "0x06/0xff+9" in restore and "0x10/0x3f+33" in restore
    old = {"dev": "eth0", "qdiscs": [], "classes": [], "raw": "", "filters": [
        {"parent": "1:", "protocol": "ip", "pref": 1, "value": 0xB8000000, "mask": 0xFC000000, "off": 1,
         "flowid": "1:10"}]}
    loaded = type(state).from_dict(old)
    assert loaded.filters[0]["keys"] == [{"value": 0xB8000000, "mask": 0xFC000000, "off": 1}]
    with pytest.raises(Exception, match="not something geryon can restore"):
        parse_state("eth0", text + "  action order 1: gact action drop\n")


class NetnsShell:
    """The interface tcstate.read_state needs (`run` -> rc, out, err), for a local namespace."""

    class endpoint:  # noqa: N801 -- what error messages name
        address = "local"

    def __init__(self, netns: str):
        self.netns = netns

    def run(self, command: str, stdin: str | None = None) -> tuple[int, str, str]:
        done = subprocess.run(["ip", "netns", "exec", self.netns, "sh", "-c", command], input=stdin,
                              capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr

    def check(self, command: str, stdin: str | None = None) -> str:
        rc, out, err = self.run(command, stdin)
        assert rc == 0, (command, err)
        return out


def _packets(netns: str, dev: str) -> dict[str, int]:
    """Packets sent per leaf class id, the ACK class 1:f included (`tc -s class show`: HTB prints text only)."""
    text = subprocess.run(["tc", "-n", netns, "-s", "class", "show", "dev", dev], capture_output=True, text=True,
                          check=True).stdout
    packets, leaf = {}, None
    for words in (line.split() for line in text.splitlines()):
        if words[:2] == ["class", "htb"]:
            leaf = words[2] if "leaf" in words else None
        elif words[:1] == ["Sent"] and leaf:
            packets[leaf] = int(words[words.index("pkt") - 1])
    return packets


@pytest.mark.root
@pytest.mark.parametrize("mode, ack_class", [("own", "1:f"), ("top", "1:10"), ("off", "1:11")])
@pytest.mark.parametrize("data_dscp", [0, 46])
def test_pure_acks_of_a_real_transfer_land_in_the_ack_class(veth_pair, mode, ack_class, data_dscp):
    pair = veth_pair
    # Data flows left -> right (low class with DSCP 0, high with 46); the right side's egress carries its ACKs,
    # which the receiving socket marks with its own DSCP 0.
    install_priority_queues(pair.right_dev, 2, "100mbit", pair.right_ns, ack_priority=mode)
    filters = subprocess.run(["tc", "-n", pair.right_ns, "filter", "show", "dev", pair.right_dev],
                             capture_output=True, text=True, check=True).stdout
    assert ("match 10000000/3f000000 at 33" in filters) == (mode != "off")
    before = _packets(pair.right_ns, pair.right_dev)
    assert send_tcp(pair, dscp=data_dscp, size=4_000_000) == 4_000_000
    # GRO coalesces the receiver's segments, so it ACKs ~one per 64 KB: ~50 ACKs for 4 MB
    assert wait_for(lambda: sum(_packets(pair.right_ns, pair.right_dev).values()) - sum(before.values()) >= 20)
    grown = {cid: n - before.get(cid, 0) for cid, n in _packets(pair.right_ns, pair.right_dev).items()}
    # every pure ACK in its class; elsewhere only the SYN-ACK, the FIN and what the namespace sends by
    # itself (ARP, IPv6 neighbour and router solicitations: 2-5 packets seen)
    assert grown[ack_class] >= 20 and sum(grown.values()) - grown[ack_class] <= 10, grown


@pytest.mark.root
def test_a_plan_with_ack_filters_verifies_and_restores(veth_pair):
    pair = veth_pair
    shell = NetnsShell(pair.left_ns)
    plan = build_priority_plan(pair.left_dev, 4, "100mbit", ack_priority="own")
    # as geryon.netconf.linuxapply applies a plan: tc -batch, then read back and compare
    batch = "\n".join(line[len("tc "):] for line in plan.commands()) + "\n"
    shell.check(f"tc qdisc del dev {pair.left_dev} root 2>/dev/null; tc -batch -", stdin=batch)
    assert read_state(shell, pair.left_dev).canonical() == plan_canonical(plan)
    # as the emulated cluster applies it (pyroute2 packs keys at byte offsets): a saved state that restores
    install_priority_queues(pair.left_dev, 4, "100mbit", pair.left_ns, ack_priority="own")
    saved = read_state(shell, pair.left_dev)
    assert len(saved.filters) == 8 and sum(len(f["keys"]) > 1 for f in saved.filters) == 2
    shell.check(f"tc qdisc del dev {pair.left_dev} root")
    assert read_state(shell, pair.left_dev).canonical() == ["qdisc kernel-default"]
    for line in saved.restore_commands(python=_python()):
        shell.check(line)
    assert read_state(shell, pair.left_dev).canonical() == saved.canonical()


def _python() -> str:
    import sys
    return sys.executable


def _filters(netns: str, dev: str) -> str:
    return subprocess.run(["tc", "-n", netns, "filter", "show", "dev", dev], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.root
def test_the_emulated_cluster_puts_acks_on_top_on_hosts_and_switch_ports(unique_name):
    from geryon.emulate import EmulatedCluster
    from geryon.emulate.cluster import DEFAULT_ACK_PRIORITY

    ack_key = "match 10000000/3f000000 at 33"
    with EmulatedCluster(unique_name, hosts=2) as cluster:
        assert cluster.describe()["ack_priority"] == DEFAULT_ACK_PRIORITY
        assert EmulatedCluster.from_record(unique_name).ack_priority == DEFAULT_ACK_PRIORITY
        for netns, dev in [(cluster.host("h1").netns, "eth0"), cluster.switch_port("h2")]:
            assert (ack_key in _filters(netns, dev)) == (DEFAULT_ACK_PRIORITY != "off")
    with EmulatedCluster(unique_name, hosts=2, ack_priority="off") as cluster:
        assert ack_key not in _filters(*cluster.switch_port("h2"))
    with EmulatedCluster(unique_name, hosts=2, priority=False, ack_priority="own") as cluster:
        assert cluster.ack_priority == "off" and "u32" not in _filters(*cluster.switch_port("h2"))
