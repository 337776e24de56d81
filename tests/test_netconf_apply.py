"""Priority queues on a real veth pair in namespaces the test creates: apply, traffic, counters, remove."""

import json
import os
import re
import subprocess
import sys

import pytest

from geryon.errors import InterfaceNotFound, NetconfError, RateError
from geryon.netconf import (Capabilities, apply_plan, build_priority_plan, counters_by_name,
                            detect_capabilities, install_priority_queues, install_shaping,
                            read_class_counters, remove_queues)
from netconf_pair import flood_udp, send_tcp, send_udp, wait_for

pytestmark = pytest.mark.root


def _tc(pair, *args) -> str:
    return subprocess.run(["tc", "-n", pair.left_ns, *args, "dev", pair.left_dev], check=True,
                          capture_output=True, text=True).stdout


def _qdisc_config(pair) -> str:
    # direct_packets_stat counts packets that met the htb qdisc before its classes existed (an IPv6
    # router solicitation may): traffic timing, not configuration.
    return re.sub(r"direct_packets_stat \d+", "direct_packets_stat N", _tc(pair, "qdisc", "show"))


def _bytes(pair) -> dict[str, int]:
    return {c.name: c.bytes for c in read_class_counters(pair.left_dev, pair.left_ns)}


def _grew_by(before, after, name, at_least) -> bool:
    return after[name] - before[name] >= at_least


def test_marked_udp_lands_in_its_class_and_the_rest_in_the_lowest(veth_pair):
    pair = veth_pair
    plan = install_priority_queues(pair.left_dev, 4, "100mbit", pair.left_ns)
    payload = 50 * 1000
    for cls in plan.classes:
        before = _bytes(pair)
        send_udp(pair.left_ns, pair.right_ip, cls.dscp, count=50, size=1000)
        assert wait_for(lambda: _grew_by(before, _bytes(pair), cls.name, payload)), cls
        after = _bytes(pair)
        others = {name: after[name] - before[name] for name in after if name != cls.name}
        assert all(grown < payload // 2 for grown in others.values()), (cls, others)
    # an unconfigured DSCP goes to the lowest class (the HTB default)
    before = _bytes(pair)
    send_udp(pair.left_ns, pair.right_ip, 12, count=50, size=1000)
    assert wait_for(lambda: _grew_by(before, _bytes(pair), "low", payload))
    after = _bytes(pair)
    assert after["high"] == before["high"]


def test_counters_carry_names_dscps_and_all_fields(veth_pair):
    pair = veth_pair
    install_priority_queues(pair.left_dev, "gold:46,bronze:0", "1gbit", pair.left_ns)
    send_udp(pair.left_ns, pair.right_ip, 46, count=20, size=500)
    counters = read_class_counters(pair.left_dev, pair.left_ns)
    assert [(c.name, c.dscp, c.classid) for c in counters] == [("gold", 46, "1:10"), ("bronze", 0, "1:11")]
    gold = counters_by_name(counters)["gold"]
    assert gold.packets >= 20 and gold.bytes >= 20 * 500
    assert set(gold.as_dict()) == {"name", "dscp", "classid", "bytes", "packets", "drops", "overlimits",
                                   "backlog_bytes", "backlog_packets"}
    assert gold.drops == 0 and gold.backlog_packets == 0


def test_marked_tcp_and_ipv6_are_classified(veth_pair):
    pair = veth_pair
    install_priority_queues(pair.left_dev, None, "1gbit", pair.left_ns)
    before = _bytes(pair)
    assert send_tcp(pair, 46, 2_000_000) == 2_000_000
    assert wait_for(lambda: _grew_by(before, _bytes(pair), "high", 2_000_000))
    assert _bytes(pair)["low"] - before["low"] < 100_000  # only ARP/ND, nothing of the marked stream
    before = _bytes(pair)
    send_udp(pair.left_ns, pair.right_ip6, 46, count=40, size=1000)
    assert wait_for(lambda: _grew_by(before, _bytes(pair), "high", 40_000))


def test_counters_survive_into_another_process(veth_pair):
    pair = veth_pair
    install_priority_queues(pair.left_dev, "a:46,b:10,c:0", "100mbit", pair.left_ns)
    program = ("import json, sys; from geryon.netconf import read_class_counters; "
               "print(json.dumps([c.as_dict() for c in read_class_counters(sys.argv[1], sys.argv[2])]))")
    out = subprocess.run([sys.executable, "-c", program, pair.left_dev, pair.left_ns], check=True,
                         capture_output=True, text=True, env=dict(os.environ)).stdout
    assert [(c["name"], c["dscp"]) for c in json.loads(out)] == [("a", 46), ("b", 10), ("c", 0)]


def test_counters_without_a_record_fall_back_to_class_ids(veth_pair, tmp_path, monkeypatch):
    pair = veth_pair
    install_priority_queues(pair.left_dev, 3, "100mbit", pair.left_ns)
    monkeypatch.setenv("GERYON_STATE_DIR", str(tmp_path / "elsewhere"))
    counters = read_class_counters(pair.left_dev, pair.left_ns)
    assert [(c.name, c.dscp) for c in counters] == [("1:10", None), ("1:11", None), ("1:12", None)]


def test_apply_twice_replaces_cleanly(veth_pair):
    pair = veth_pair
    install_priority_queues(pair.left_dev, 8, "100mbit", pair.left_ns)
    install_priority_queues(pair.left_dev, 8, "100mbit", pair.left_ns)
    assert _tc(pair, "class", "show").count("class htb") == 9
    install_priority_queues(pair.left_dev, 2, "200mbit", pair.left_ns)
    classes = _tc(pair, "class", "show")
    assert classes.count("class htb") == 3 and "200Mbit" in classes
    assert _tc(pair, "filter", "show").count("flowid") == 2  # IPv4 + IPv6 for the one non-default class
    assert [c.name for c in read_class_counters(pair.left_dev, pair.left_ns)] == ["high", "low"]


def test_tc_command_lines_build_the_same_configuration(veth_pair):
    pair = veth_pair
    plan = install_priority_queues(pair.left_dev, 4, "100mbit", pair.left_ns)
    by_netlink = (_tc(pair, "class", "show"), _qdisc_config(pair))
    remove_queues(pair.left_dev, pair.left_ns)
    for line in plan.commands():
        subprocess.run(line.split(), check=True, capture_output=True)
    assert (_tc(pair, "class", "show"), _qdisc_config(pair)) == by_netlink
    normalize = lambda text: sorted(line.split(" fh ")[0] + line.split("flowid")[-1]  # noqa: E731
                                    for line in text.splitlines() if "flowid" in line)
    filters_by_tc = normalize(_tc(pair, "filter", "show"))
    install_priority_queues(pair.left_dev, 4, "100mbit", pair.left_ns)
    assert normalize(_tc(pair, "filter", "show")) == filters_by_tc


def test_remove_returns_to_the_kernel_default(veth_pair):
    pair = veth_pair
    install_priority_queues(pair.left_dev, None, "100mbit", pair.left_ns)
    remove_queues(pair.left_dev, pair.left_ns)
    assert "htb" not in _tc(pair, "qdisc", "show")
    assert read_class_counters(pair.left_dev, pair.left_ns) == []
    remove_queues(pair.left_dev, pair.left_ns)  # nothing to remove: no error


def test_removing_the_last_devices_queues_removes_its_namespaces_state_directory(veth_pair, tmp_path):
    pair = veth_pair          # its fixture points the state directory at tmp_path / "state"
    records = tmp_path / "state" / "netconf" / pair.left_ns
    install_priority_queues(pair.left_dev, None, "100mbit", pair.left_ns)
    install_shaping("lo", "100mbit", pair.left_ns)
    assert sorted(p.name for p in records.iterdir()) == [f"{pair.left_dev}.json", "lo.json"]
    remove_queues(pair.left_dev, pair.left_ns)
    assert [p.name for p in records.iterdir()] == ["lo.json"]   # the other device's record stays
    remove_queues("lo", pair.left_ns)
    assert not records.exists()


def test_shaping_only(veth_pair):
    pair = veth_pair
    plan = install_shaping(pair.left_dev, "20mbit", pair.left_ns)
    assert plan.layout == "shaping"
    send_udp(pair.left_ns, pair.right_ip, 46, count=20, size=1000)
    counters = read_class_counters(pair.left_dev, pair.left_ns)
    assert len(counters) == 1 and counters[0].name == "all" and counters[0].dscp is None and counters[0].bytes >= 20_000


def test_unshaped_priority_uses_what_the_kernel_offers(veth_pair):
    pair = veth_pair
    plan = install_priority_queues(pair.left_dev, 2, None, pair.left_ns)
    expected = detect_capabilities().strict_priority_qdisc() or "htb"
    assert plan.layout == expected
    assert f"qdisc {expected} 1:" in _tc(pair, "qdisc", "show")


def test_missing_interface_and_namespace_are_typed_errors(veth_pair):
    pair = veth_pair
    with pytest.raises(InterfaceNotFound, match="'gynothere' does not exist"):
        install_priority_queues("gynothere", None, "100mbit", pair.left_ns)
    with pytest.raises(InterfaceNotFound):
        remove_queues("gynothere", pair.left_ns)
    with pytest.raises(InterfaceNotFound):
        read_class_counters("gynothere", pair.left_ns)
    missing_ns = pair.left_ns + "x"
    with pytest.raises(InterfaceNotFound, match="namespace"):
        install_priority_queues(pair.left_dev, None, "100mbit", missing_ns)
    assert not os.path.exists(f"/run/netns/{missing_ns}")  # pyroute2 would have created it
    with pytest.raises(RateError):
        install_priority_queues(pair.left_dev, None, "100 furlongs", pair.left_ns)
    assert "htb" not in _tc(pair, "qdisc", "show")  # nothing half-applied


def test_capabilities_probe_finds_htb_and_u32():
    capabilities = detect_capabilities(refresh=True)
    assert capabilities.detected
    assert {"htb", "pfifo"} <= capabilities.qdiscs and "u32" in capabilities.classifiers
    assert detect_capabilities() is capabilities  # cached


@pytest.mark.timing
def test_high_class_takes_the_link_from_a_competing_low_flood(veth_pair):
    """Strict priority on a saturated 10 Mbit/s port: the DSCP 46 flood gets nearly all of it."""
    pair = veth_pair
    install_priority_queues(pair.left_dev, None, "10mbit", pair.left_ns)
    send_udp(pair.left_ns, pair.right_ip, 0, count=1)  # resolve ARP before measuring
    floods = [flood_udp(pair.left_ns, pair.right_ip, dscp, 1.5) for dscp in (0, 46)]
    for flood in floods:
        flood.wait(timeout=60)
    counters = counters_by_name(read_class_counters(pair.left_dev, pair.left_ns))
    high, low = counters["high"], counters["low"]
    assert high.bytes > 0.85 * (high.bytes + low.bytes), (high, low)
    assert low.bytes > 0  # the low class was not blocked outright: it keeps its ~1% guarantee


FAILING_TEST = '''
import pytest
from conftest import veth_pair  # noqa: F401 -- the fixture under test
from geryon.netconf import install_priority_queues

@pytest.fixture
def unique_name():
    return {name!r}

def test_fails_midway(veth_pair):
    install_priority_queues(veth_pair.left_dev, None, "10mbit", veth_pair.left_ns)
    raise RuntimeError("boom")
'''


@pytest.mark.slow
def test_fixture_removes_its_namespaces_when_a_test_fails(unique_name, tmp_path):
    test_file = tmp_path / "test_failing.py"
    test_file.write_text(FAILING_TEST.format(name=unique_name))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert "1 failed" in result.stdout, result.stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"gy{unique_name}" not in namespaces


def test_a_failing_operation_reports_tc_and_leaves_nothing_behind(veth_pair):
    pair = veth_pair
    if detect_capabilities().strict_priority_qdisc():
        pytest.skip("this kernel has prio/ets, so the plan would not fail")
    strict_kernel = Capabilities(frozenset({"htb", "prio"}), frozenset({"u32"}))
    plan = build_priority_plan(pair.left_dev, 2, None, strict_kernel, pair.left_ns)
    install_priority_queues(pair.left_dev, 2, "10mbit", pair.left_ns)
    with pytest.raises(NetconfError, match=r"`tc -n \S+ qdisc add dev gyl0 root handle 1: prio.*failed: .*unknown"):
        apply_plan(plan)
    assert "htb" not in _tc(pair, "qdisc", "show")
    assert read_class_counters(pair.left_dev, pair.left_ns) == []
