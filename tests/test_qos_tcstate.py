"""Reading a device's tc state back: parsing the dumps, comparing with a plan, and the restore commands."""

import pytest

from geryon.errors import ApplyError
from geryon.netconf.qos_profile import builtin_profile
from geryon.netconf.remote import Endpoint
from geryon.netconf.render.linux import build_plan
from geryon.netconf.session import build_session, json_patch
from geryon.netconf.render import render
from geryon.netconf.tcstate import SEPARATOR, parse_state, plan_canonical, tc_rate

# What `geryon emulate up` leaves on a port (pyroute2 packs the DSCP key at offset 1), as tc prints it.
QDISCS = ('[{"kind":"htb","handle":"1:","root":true,"refcnt":3,"options":{"r2q":10,"default":"0x11",'
          '"direct_packets_stat":0,"direct_qlen":1000}},{"kind":"pfifo","handle":"10:","parent":"1:10",'
          '"options":{"limit":1000}},{"kind":"pfifo","handle":"11:","parent":"1:11","options":{"limit":1000}}]')
CLASSES = "".join(line + "\n" for line in (
    "class htb 1:11 parent 1:1 leaf 11: prio 1 quantum 15140 rate 1Mbit ceil 100Mbit linklayer ethernet b"
    "urst 1600b/1 mpu 0b cburst 1600b/1 mpu 0b level 0",
    "class htb 1:10 parent 1:1 leaf 10: prio 0 quantum 15140 rate 99Mbit ceil 100Mbit linklayer ethernet "
    "burst 1584b/1 mpu 0b cburst 1600b/1 mpu 0b level 0",
    "class htb 1:1 root rate 100Mbit ceil 100Mbit linklayer ethernet burst 1600b/1 mpu 0b cburst 1600b/1 "
    "mpu 0b level 7",
))
FILTERS = ('[{"parent":"1:","protocol":"ip","pref":1,"kind":"u32","chain":0},{"parent":"1:","protocol":"ip",'
           '"pref":1,"kind":"u32","chain":0,"options":{"fh":"800::800","flowid":"1:10","match":{"value":"b8000000",'
           '"mask":"fc000000","offmask":"","off":1}}},{"parent":"1:","protocol":"ipv6","pref":2,"kind":"u32",'
           '"chain":0,"options":{"fh":"801::800","flowid":"1:10","match":{"value":"b800000","mask":"fc00000",'
           '"offmask":"","off":0}}}]')


def state():
    return parse_state("eth0", f"{QDISCS}\n{SEPARATOR}\n{CLASSES}{SEPARATOR}\n{FILTERS}")


def test_parse_and_canonical():
    current = state()
    assert [c["classid"] for c in current.classes] == ["1:11", "1:10", "1:1"]
    lines = current.canonical()
    assert "class htb 1:10 parent 1:1 prio 0 quantum 15140 rate 99Mbit ceil 100Mbit" in lines
    assert "class htb 1:1 parent root rate 100Mbit ceil 100Mbit" in lines
    assert "filter 1: ip pref 1 u32 b8000000/fc000000 at 1 flowid 1:10" in lines


def test_plan_canonical_differs_only_where_the_plan_does():
    profile = builtin_profile("two-class").with_ports(["eth0"])
    desired = plan_canonical(build_plan(profile.__class__(**{**profile.__dict__, "rate": 100 * 10**6}), "eth0"))
    current = state().canonical()
    assert set(current) - set(desired) == {"filter 1: ip pref 1 u32 b8000000/fc000000 at 1 flowid 1:10"}
    assert set(desired) - set(current) == {"filter 1: ip pref 1 u32 00b80000/00fc0000 at 0 flowid 1:10"}


def test_restore_commands_rebuild_the_state():
    lines = state().restore_commands("/opt/py")
    assert lines[0] == "tc qdisc del dev eth0 root 2>/dev/null || true"
    assert lines[1] == "tc qdisc add dev eth0 root handle 1: htb default 11"
    assert lines[2].startswith("tc class add dev eth0 parent 1: classid 1:1 htb rate 100000000bit")
    assert "tc qdisc add dev eth0 parent 1:10 handle 10: pfifo limit 1000" in lines
    # filters in dump order (the kernel numbers hash tables as they come): the packed key via pyroute2 first,
    # one key per masked byte (geryon.netconf.plan.pyroute2_keys)
    assert lines[-2].startswith("/opt/py -c ") and "0xb8/0xfc+1" in lines[-2]
    assert lines[-1] == ("tc filter add dev eth0 parent 1: protocol ipv6 pref 2 u32 match u32 0x0b800000 0x0fc00000 "
                         "at 0 flowid 1:10")


def test_unknown_qdisc_is_refused_before_anything_changes():
    text = ('[{"kind":"cake","handle":"8001:","root":true,"options":{}}]' + f"\n{SEPARATOR}\n\n{SEPARATOR}\n[]")
    with pytest.raises(ApplyError, match="not something geryon can save and restore"):
        parse_state("eth0", text).check_restorable()
    empty = f"\n{SEPARATOR}\n\n{SEPARATOR}\n[]"
    default = parse_state("eth0", '[{"kind":"noqueue","handle":"0:","root":true}]' + empty)
    assert default.canonical() == ["qdisc kernel-default"] and len(default.restore_commands()) == 1


def test_tc_rate_prints_like_iproute2():
    assert [tc_rate(r) for r in (99 * 10**6, 12345678, 10**10, 800)] == ["99Mbit", "12345Kbit", "10Gbit", "800bit"]


def test_sonic_patch_from_running_config():
    """Field by field: a changed field is replaced alone, a missing entry added whole, others left alone."""
    profile = render(builtin_profile("two-class").with_ports(["Ethernet0"]), "sonic").profile  # top class on 6
    from geryon.netconf.render.sonic import config_db
    desired = config_db(profile)
    assert [op["path"] for op in json_patch({}, desired)][:2] == ["/DSCP_TO_TC_MAP", "/TC_TO_QUEUE_MAP"]
    running = {**desired, "SCHEDULER": {**desired["SCHEDULER"], "GERYON_Q0": {"type": "DWRR", "weight": "5"}},
               "QUEUE": {"Ethernet0|3": {"scheduler": "scheduler.1", "wred_profile": "AZURE_LOSSLESS"},
                         "Ethernet0|0": {"scheduler": "scheduler.0"}}}
    assert json_patch(running, desired) == [
        {"op": "replace", "path": "/SCHEDULER/GERYON_Q0/weight", "value": "100"},
        {"op": "add", "path": "/QUEUE/Ethernet0|6", "value": {"scheduler": "GERYON_Q6"}},
        {"op": "replace", "path": "/QUEUE/Ethernet0|0/scheduler", "value": "GERYON_Q0"},
        {"op": "add", "path": "/QUEUE/Ethernet0|7", "value": {"scheduler": "GERYON_CONTROL"}}]
    assert json_patch(desired, desired) == []


@pytest.mark.parametrize("kind, save, confirm, rollback", [
    ("sonic", "sudo config checkpoint geryon-qos", "sudo config delete-checkpoint geryon-qos",
     "sudo config apply-patch /tmp/geryon-qos.json-patch"),  # the exact inverse of the applied patch
    ("eos", "show running-config", "configure session geryon-qos commit", "configure session geryon-qos abort"),
    ("junos", "show configuration | display set", "commit", "rollback 1"),
    ("nxos", "checkpoint geryon-qos", "no checkpoint geryon-qos", "rollback running-config checkpoint geryon-qos"),
    ("nvue", "nv config history", None, "nv config apply {revision} -y"),
])
def test_vendor_sessions_use_the_platform_safety_net(kind, save, confirm, rollback):
    profile = builtin_profile("two-class")
    session = build_session(profile, render(profile, kind))
    assert session.save[0].command == save
    if confirm:
        assert confirm in session.confirm[0].command + (session.confirm[0].stdin or "")
    assert rollback in session.rollback[0].command + (session.rollback[0].stdin or "")
    shown = session.show()
    if kind == "eos":
        assert "commit timer 00:05:00" in shown and "configure session geryon-qos\n" in shown
    if kind == "junos":
        assert "commit confirmed 5" in shown


def test_endpoint_parsing():
    assert Endpoint.parse("sonic@admin@leaf1:2222") == Endpoint("sonic", "leaf1", 2222, "admin")
    assert Endpoint.parse("linux@10.0.0.5").known_hosts_name == "10.0.0.5"
    with pytest.raises(Exception, match="KIND@HOST"):
        Endpoint.parse("10.0.0.5")


def test_read_back_expectations_follow_each_platform_display():
    from geryon.netconf.session import expected_lines
    junos = expected_lines("junos", ["set a code-points [ 000000 000001 ]", "set b"])
    assert junos == ["set a code-points 000000", "set a code-points 000001", "set b"]
    eos = expected_lines("eos", ["qos map traffic-class 6 to tx-queue 6", "      priority strict", "   tx-queue 6"])
    assert eos == ["   tx-queue 6"]
