"""Queue plans as data: the operation list and tc lines for 2, 4 and 8 classes (no root needed)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geryon.errors import ClassSpecError, RateError
from geryon.netconf import (Capabilities, ClassOp, FilterOp, QdiscOp, build_priority_plan,
                            build_shaping_plan, default_classes, parse_classes)
from geryon.netconf.plan import (HTB_QUANTUM, UNSHAPED_RATE, format_tc_rate, handle_to_int, htb_burst,
                                 int_to_handle)

STRICT_KERNEL = Capabilities(frozenset({"htb", "pfifo", "prio", "ets"}), frozenset({"u32", "flower"}))
HTB_ONLY_KERNEL = Capabilities(frozenset({"htb", "pfifo"}), frozenset({"u32"}))


def _of(plan, kind):
    return [op for op in plan.ops if isinstance(op, kind)]


@pytest.mark.parametrize("count", [2, 4, 8])
def test_htb_plan_operations(count):
    rate = 100 * 10**6
    plan = build_priority_plan("gy0", count, "100mbit")
    classes = default_classes(count)
    class_ids = tuple(f"1:{0x10 + i:x}" for i in range(count))
    assert plan.layout == "htb" and plan.rate == rate and plan.classes == classes
    assert plan.class_ids == class_ids
    qdiscs, htb_classes, filters = _of(plan, QdiscOp), _of(plan, ClassOp), _of(plan, FilterOp)
    assert len(plan.ops) == len(qdiscs) + len(htb_classes) + len(filters)
    # root: htb defaulting to the lowest class
    assert qdiscs[0] == QdiscOp("gy0", "htb", "1:", "root", (("default", class_ids[-1][2:]),))
    # one pfifo leaf per class
    assert [(op.kind, op.parent) for op in qdiscs[1:]] == [("pfifo", cid) for cid in class_ids]
    # parent at link rate, children strictly ordered by HTB prio, all may borrow to 100%
    parent, *children = htb_classes
    assert (parent.classid, parent.parent, dict(parent.params)["rate"]) == ("1:1", "1:", rate)
    assert [op.classid for op in children] == list(class_ids)
    params = [dict(op.params) for op in children]
    assert [p["prio"] for p in params] == list(range(count))
    assert all(p["ceil"] == rate and p["quantum"] == HTB_QUANTUM for p in params)
    # token buckets of 1 ms of their rate and a frame, not tc's one-frame default (see HTB_BURST_SECONDS)
    assert all(p["burst"] == htb_burst(p["rate"]) and p["cburst"] == htb_burst(rate) for p in params)
    assert params[0]["rate"] >= 0.98 * rate
    assert sum(p["rate"] for p in params) == rate
    assert all(0 < p["rate"] <= 0.01 * rate for p in params[1:])
    # u32 filters for every class but the default one, for IPv4 and IPv6
    expected = {(proto, cls.dscp, cid) for cls, cid in zip(classes[:-1], class_ids[:-1])
                for proto in ("ip", "ipv6")}
    assert {(op.protocol, op.dscp, op.flowid) for op in filters} == expected
    assert all(op.kind == "u32" and op.parent == "1:" for op in filters)
    assert len({(op.protocol, op.pref) for op in filters}) == 2  # one pref per protocol


def test_two_class_commands_match_the_layout_seen_working():
    assert build_priority_plan("eth0", None, "100mbit").commands() == [
        "tc qdisc add dev eth0 root handle 1: htb default 11",
        "tc class add dev eth0 parent 1: classid 1:1 htb rate 100mbit ceil 100mbit quantum 15140 burst 14100 "
        "cburst 14100",
        "tc class add dev eth0 parent 1:1 classid 1:10 htb rate 99mbit ceil 100mbit prio 0 quantum 15140 "
        "burst 13975 cburst 14100",
        "tc class add dev eth0 parent 1:1 classid 1:11 htb rate 1mbit ceil 100mbit prio 1 quantum 15140 "
        "burst 1725 cburst 14100",
        "tc qdisc add dev eth0 parent 1:10 handle 10: pfifo limit 1000",
        "tc qdisc add dev eth0 parent 1:11 handle 11: pfifo limit 1000",
        "tc filter add dev eth0 parent 1: protocol ip pref 1 u32 match ip dsfield 0xb8 0xfc flowid 1:10",
        "tc filter add dev eth0 parent 1: protocol ipv6 pref 2 u32 match ip6 priority 0xb8 0xfc flowid 1:10",
    ]


def test_commands_in_a_namespace_use_tc_netns():
    plan = build_priority_plan("eth0", 2, "1gbit", netns="gyx-sw")
    assert all(line.startswith("tc -n gyx-sw ") for line in plan.commands())


def test_class_for_dscp_defaults_to_lowest():
    plan = build_priority_plan("gy0", "a:46,b:26,c:0", "1gbit")
    assert plan.class_for_dscp(46) == "1:10"
    assert plan.class_for_dscp(26) == "1:11"
    assert plan.class_for_dscp(0) == plan.class_for_dscp(63) == "1:12"


def test_unshaped_plan_uses_strict_priority_qdisc_where_the_kernel_has_one():
    plan = build_priority_plan("gy0", 3, None, STRICT_KERNEL)
    assert plan.layout == "prio" and plan.rate is None
    assert plan.class_ids == ("1:1", "1:2", "1:3")
    root = plan.ops[0]
    assert root.kind == "prio" and dict(root.params)["priomap"] == (2,) * 16
    assert not _of(plan, ClassOp)
    lines = plan.commands()
    assert "tc filter add dev gy0 parent 1: protocol ip pref 1 u32 match ip dsfield 0xb8 0xfc flowid 1:1" in lines


def test_unshaped_plan_with_ets_and_flower():
    caps = Capabilities(frozenset({"htb", "ets"}), frozenset({"flower"}))
    plan = build_priority_plan("gy0", 2, None, caps)
    assert plan.layout == "ets"
    assert plan.commands()[0] == ("tc qdisc add dev gy0 root handle 1: ets bands 2 strict 2 "
                                  "priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1")
    assert "flower ip_tos 0xb8/0xfc classid 1:1" in plan.commands()[-1]


def test_unshaped_plan_falls_back_to_fast_htb_on_this_kind_of_kernel():
    for caps in (HTB_ONLY_KERNEL, None):
        plan = build_priority_plan("gy0", 2, None, caps)
        assert plan.layout == "htb" and plan.rate == UNSHAPED_RATE
        assert plan.notes and "HTB" in plan.notes[0]


def test_shaping_plan_has_one_class_and_no_filters():
    plan = build_shaping_plan("gy0", "50mbit")
    assert plan.layout == "shaping" and plan.classes == () and plan.class_ids == ("1:10",)
    assert not _of(plan, FilterOp)
    assert plan.commands()[0] == "tc qdisc add dev gy0 root handle 1: htb default 10"
    assert all(dict(op.params)["rate"] == 50 * 10**6 for op in _of(plan, ClassOp))


def test_u32_keys_for_pyroute2():
    ip, ip6 = (FilterOp("gy0", "1:", proto, pref, 46, "1:10") for pref, proto in ((1, "ip"), (2, "ipv6")))
    assert ip.u32_key() == "0x00b80000/0x00fc0000+0"
    assert ip6.u32_key() == "0x0b800000/0x0fc00000+0"
    assert (ip.ethertype, ip6.ethertype) == (0x0800, 0x86DD)


def test_handles_and_rates():
    assert handle_to_int("1:") == 0x10000 and handle_to_int("1:10") == 0x10010
    assert int_to_handle(0x10011) == "1:11"
    assert [format_tc_rate(r) for r in (10**9, 99 * 10**6, 1_250_000, 8123)] == \
        ["1gbit", "99mbit", "1250kbit", "8123bit"]


@pytest.mark.parametrize("rate", ["100 furlongs", "fast", "-5mbit", "1mbitt"])
def test_unknown_rate_syntax(rate):
    with pytest.raises(RateError, match="unknown rate"):
        build_priority_plan("gy0", None, rate)


def test_bad_classes_rejected_before_planning():
    with pytest.raises(ClassSpecError):
        build_priority_plan("gy0", "a:1,b:1", "1gbit")


def test_rate_too_low_for_the_classes():
    with pytest.raises(RateError, match="too low for 8 priority classes"):
        build_priority_plan("gy0", 8, "50kbit")
    assert build_priority_plan("gy0", 2, "50kbit").rate == 50_000


@given(count=st.integers(1, 8), rate=st.integers(10**6, 10**11))
@settings(max_examples=60, deadline=None)
def test_htb_rates_add_up_for_any_link(count, rate):
    plan = build_priority_plan("gy0", count, rate)
    children = [dict(op.params) for op in _of(plan, ClassOp)][1:]
    assert sum(p["rate"] for p in children) == rate
    assert children[0]["rate"] >= 0.9 * rate
    assert all(p["rate"] > 0 and p["ceil"] == rate for p in children)


@given(dscps=st.lists(st.integers(0, 63), min_size=1, max_size=8, unique=True))
def test_any_unique_dscps_round_trip(dscps):
    spec = ",".join(f"c{i}:{dscp}" for i, dscp in enumerate(dscps))
    classes = parse_classes(spec)
    assert [cls.dscp for cls in classes] == dscps
    plan = build_priority_plan("gy0", classes, "1gbit")
    assert all(plan.class_for_dscp(dscp) == classid for dscp, classid in zip(dscps, plan.class_ids))
