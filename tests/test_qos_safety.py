"""Every switch target on a production fabric: network control (CS6/CS7) keeps a protected queue above the
training classes, lossy classes stay off the platform's default-lossless queues and lossless classes render
or are refused, IPv4 and IPv6 are classified alike, CLI renderings touch only lines geryon owns, and each
rendering names the commands that show its per-queue counters. SONiC's apply and roll back against a stock
running config are in test_qos_safety_sonic.py."""

import json
import re

import pytest

from geryon.errors import QosProfileError, TargetLimitError
from geryon.netconf.qos_profile import (CONTROL_SHARE_PERCENT, STRICT_GUARD_PERCENT, QosClass, QosProfile,
                                    builtin_profile, profile_from_dict, validate_profile)
from geryon.netconf.render import TARGETS, render
from geryon.netconf.render.linux import class_rates
from geryon.netconf.render.openconfig import parse_queue_counters
from geryon.netconf.session import build_session

SWITCHES = ("sonic", "openconfig", "eos", "nxos", "nvue", "junos")
CLI = ("eos", "nxos", "nvue", "junos")
PORTS = {"sonic": ["Ethernet0", "Ethernet4"], "openconfig": ["Ethernet0", "Ethernet4"],
         "eos": ["Ethernet1", "Ethernet2"],
         "nxos": ["Ethernet1/1", "Ethernet1/2"], "nvue": ["swp1", "swp2"], "junos": ["xe-0/0/0", "xe-0/0/1"],
         "linux": ["eth1", "eth2"]}


def four(target):
    return builtin_profile("four-class").with_ports(PORTS[target])


def profile(*classes):
    return validate_profile(QosProfile("p", tuple(classes), classes[-1].name))


# --- network control ------------------------------------------------------------------------------

def test_a_class_cannot_claim_network_control_dscps():
    for dscp in (48, 56):
        with pytest.raises(QosProfileError, match=f"DSCP {dscp} .* network control"):
            profile(QosClass("high", (dscp,), 6, "strict"), QosClass("low", (0,), 0, "weighted", 100))


@pytest.mark.parametrize("target", SWITCHES)
def test_every_switch_keeps_queue_7_for_network_control(target):
    rendering = render(four(target), target)
    assert [c.queue for c in rendering.profile.classes] == [6, 5, 2, 0]
    assert any("moved from queue 7 to 6" in note for note in rendering.notes)


def test_eos_control_on_traffic_class_7_strict_above_the_classes():
    text = render(four("eos"), "eos").text
    assert "qos map dscp 48 56 to traffic-class 7\n" in text
    assert not re.search(r"qos map dscp [\d ]*\b(48|56)\b[\d ]* to traffic-class [0-6]\n", text)
    assert "tx-queue 7" not in text  # left strict, the EOS default, above the strict class on 6
    assert "   tx-queue 6\n      priority strict\n" in text


def test_nxos_control_on_priority_level_1_the_strict_class_on_level_2():
    text = render(four("nxos"), "nxos").text
    assert "class-map type qos match-any GERYON-control\n  match dscp 48,56\n" in text
    assert "policy-map type qos GERYON-IN\n  class GERYON-control\n    set qos-group 7\n" in text
    assert "c-out-8q-q7\n    priority level 1\n" in text and "c-out-8q-q6\n    priority level 2\n" in text
    assert text.count("priority level 1") == 1


def test_nvue_control_on_strict_traffic_class_7():
    text = render(four("nvue"), "nvue").text
    for dscp in (48, 56):
        assert f"nv set qos mapping default-global dscp {dscp} switch-priority 7\n" in text
    assert "egress-queue-mapping default-global switch-priority 7 traffic-class 7\n" in text
    assert "egress-scheduler default-global traffic-class 7 mode strict\n" in text
    assert text.count("switch-priority 7\n") == 2  # only 48 and 56 map there


def test_junos_control_gets_its_share_and_the_strict_class_a_shaper():
    """QFX takes one strict-high queue; Juniper recommends a shaping rate on it so it cannot starve the rest."""
    text = render(four("junos"), "junos").text
    for kind in ("dscp GERYON-DSCP", "dscp-ipv6 GERYON-DSCP6"):
        assert (f"classifiers {kind} forwarding-class network-control loss-priority low "
                "code-points [ 110000 111000 ]\n") in text
    assert f"schedulers geryon-high-sched shaping-rate percent {STRICT_GUARD_PERCENT}\n" in text
    assert f"schedulers geryon-control-sched transmit-rate percent {CONTROL_SHARE_PERCENT}\n" in text
    assert "scheduler-maps GERYON-MAP forwarding-class network-control scheduler geryon-control-sched\n" in text
    rates = [int(r) for r in re.findall(r"transmit-rate percent (\d+)", text)]
    assert sum(rates) == 100 and min(rates) >= 1


def test_openconfig_control_is_served_first():
    qos = render(four("openconfig"), "openconfig").data["openconfig-qos:qos"]
    for classifier in qos["classifiers"]["classifier"]:
        terms = {t["id"]: t for t in classifier["terms"]["term"]}
        key = classifier["config"]["type"].lower()
        assert terms["geryon-control"]["conditions"][key]["config"]["dscp-set"] == [48, 56]
        assert all(48 not in t["conditions"][key]["config"]["dscp-set"]
                   for i, t in terms.items() if i != "geryon-control")
    first = qos["scheduler-policies"]["scheduler-policy"][0]["schedulers"]["scheduler"][0]
    assert first["config"] == {"sequence": 0, "priority": "STRICT"}
    assert [i["id"] for i in first["inputs"]["input"]] == ["geryon-control"]
    assert {"name": "geryon-control", "config": {"name": "geryon-control", "queue-id": 7}} in qos["queues"]["queue"]


def test_linux_keeps_a_guaranteed_rate_for_the_default_class_where_control_lands():
    prof = four("linux")
    rates = class_rates(prof, 10**10)
    assert rates[-1] > 0 and sum(rates) == 10**10  # HTB guarantees it even under a saturated top class
    text = render(prof, "linux").text
    assert "0xc0 0xfc" not in text and "0xe0 0xfc" not in text  # no filter sends 48/56 elsewhere


# --- lossless queues -------------------------------------------------------------------------------

def lossy_on(queue):
    return profile(QosClass("high", (46,), 6, "strict"), QosClass("bulk", (10,), queue, "weighted", 50),
                   QosClass("low", (0,), 0, "weighted", 50))


def lossless_on(queue):
    return profile(QosClass("high", (46,), 6, "strict"), QosClass("roce", (26,), queue, "weighted", 50, lossless=True),
                   QosClass("low", (0,), 0, "weighted", 50))


def test_lossless_key_in_toml():
    data = {"class": [{"name": "roce", "dscp": [26], "queue": 3, "lossless": True},
                      {"name": "low", "dscp": [0], "queue": 0, "weight": 100}]}
    data["class"][0]["weight"] = 50
    assert profile_from_dict(data).classes[0].lossless
    data["class"][0]["lossless"] = "yes"
    with pytest.raises(QosProfileError, match="lossless of class 'roce'.* true or false"):
        profile_from_dict(data)


@pytest.mark.parametrize("target", ["sonic", "junos"])
@pytest.mark.parametrize("queue", [3, 4])
def test_lossy_class_refused_on_a_default_lossless_queue(target, queue):
    with pytest.raises(TargetLimitError, match=f"'bulk' .* lossy but queue {queue} is lossless"):
        render(lossy_on(queue), target)


@pytest.mark.parametrize("target", ["eos", "nxos", "nvue", "openconfig", "linux"])
def test_targets_without_default_lossless_queues_take_a_lossy_class_on_3(target):
    assert render(lossy_on(3), target).profile.by_name("bulk").queue == 3


def test_junos_lossless_class_is_a_no_loss_forwarding_class():
    text = render(lossless_on(3), "junos").text
    assert "set class-of-service forwarding-classes class geryon-roce queue-num 3 no-loss\n" in text
    assert "forwarding-classes class geryon-low queue-num 0\n" in text


def test_eos_lossless_class_gets_pfc_no_drop_on_every_port():
    prof = lossless_on(3).with_ports(["Ethernet1", "Ethernet2"])
    text = render(prof, "eos").text
    for port in ("Ethernet1", "Ethernet2"):
        assert (f"interface {port}\n   service-profile GERYON\n   priority-flow-control on\n"
                "   priority-flow-control priority 3 no-drop\n") in text
    assert "priority-flow-control" not in render(lossy_on(3), "eos").text


@pytest.mark.parametrize("target", ["nxos", "nvue", "openconfig"])
def test_lossless_class_refused_where_pfc_is_not_geryons(target):
    with pytest.raises(TargetLimitError, match=f"{target} cannot carry lossless class 'roce'"):
        render(lossless_on(3), target)


def test_linux_lossless_class_says_pfc_is_the_nics():
    assert any("tc has no PFC" in note for note in render(lossless_on(3), "linux").notes)


# --- IPv4 and IPv6 ---------------------------------------------------------------------------------

def test_openconfig_ipv4_and_ipv6_classifiers_carry_the_same_terms():
    v4, v6 = render(four("openconfig"), "openconfig").data["openconfig-qos:qos"]["classifiers"]["classifier"]
    assert (v4["config"]["type"], v6["config"]["type"]) == ("IPV4", "IPV6")
    sets = [{t["id"]: t["conditions"][k]["config"]["dscp-set"] for t in c["terms"]["term"]}
            for c, k in ((v4, "ipv4"), (v6, "ipv6"))]
    assert sets[0] == sets[1] and sorted(d for s in sets[0].values() for d in s) == list(range(64))


def test_junos_classifies_ipv6_with_the_same_code_points():
    text = render(four("junos"), "junos").text
    v4 = re.findall(r"classifiers dscp GERYON-DSCP (forwarding-class .*)\n", text)
    v6 = re.findall(r"classifiers dscp-ipv6 GERYON-DSCP6 (forwarding-class .*)\n", text)
    assert v4 == v6 and len(v4) == 5
    for port in PORTS["junos"]:
        assert f"interfaces {port} unit 0 classifiers dscp-ipv6 GERYON-DSCP6\n" in text


def test_linux_filters_ipv4_and_ipv6_alike():
    text = render(four("linux"), "linux").text
    for tos, tclass in (("0xb8", "0xb8"), ("0x88", "0x88"), ("0x48", "0x48")):  # 46, 34, 18
        assert text.count(f"match ip dsfield {tos} 0xfc") == text.count(f"match ip6 priority {tclass} 0xfc") == 2


@pytest.mark.parametrize("target", ["sonic", "eos", "nxos", "nvue"])
def test_dscp_classification_is_not_ipv4_only(target):
    """These targets classify by the DSCP field of either header (see each renderer's docstring): the
    rendering must not narrow it to one family."""
    rendering = render(four(target), target)
    text = rendering.text.lower()
    assert not re.search(r"\bipv4\b|\binet\b|ip access-list|match ip\b", text)


# --- only what geryon owns -------------------------------------------------------------------------

OWNED_BLOCK = {"eos": re.compile(r"^(qos profile GERYON|interface \S+|traffic-policies)$"),
               "nxos": re.compile(r"^(policy-map type \S+ GERYON-\S+|class-map type qos match-any GERYON-\S+|"
                                  r"ip access-list GERYON-\S+|system qos|interface \S+)$")}


@pytest.mark.parametrize("target", CLI)
def test_cli_renderings_never_negate_or_default_a_line_they_do_not_own(target):
    prof = builtin_profile("four-class").with_ports(PORTS[target])
    for mode in ("off", "top"):
        if mode == "top" and target == "nvue":
            continue
        prof = validate_profile(QosProfile(prof.name, prof.classes, prof.default_class, ports=prof.ports,
                                           ack_priority=mode))
        block = None
        for line in render(prof, target).commands:
            if not line.startswith(" "):
                block = line
            words = line.split()
            if words[0] in ("no", "default", "delete") or words[:2] == ["nv", "unset"]:
                assert target in OWNED_BLOCK and block and OWNED_BLOCK[target].match(block), (target, block, line)


@pytest.mark.parametrize("target", CLI)
def test_cli_sessions_apply_exactly_the_rendered_lines_and_undo_that_change(target):
    prof = four(target)
    rendering = render(prof, target)
    session = build_session(rendering.profile, rendering)
    sent = session.apply[0].stdin.splitlines()
    wrapper = {"eos": (1, 1), "junos": (1, 2), "nxos": (0, 1), "nvue": (0, 1)}[target]
    assert sent[wrapper[0]:len(sent) - wrapper[1]] == list(rendering.commands)
    undo = " ".join(s.command + " " + (s.stdin or "") for s in session.rollback)
    expected = {"eos": "configure session geryon-qos abort", "junos": "rollback 1",
                "nxos": "rollback running-config checkpoint geryon-qos", "nvue": "nv config apply {revision} -y"}
    assert expected[target] in undo


# --- verification ----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_every_rendering_names_its_per_queue_counter_commands(target):
    prof = four(target)
    rendering = render(prof, target)
    ports = PORTS[target]
    assert len(rendering.verify) == len(ports) and all(p in v for p, v in zip(ports, rendering.verify))
    assert rendering.as_dict()["verify"] == list(rendering.verify)
    if target in CLI:
        comment = "#" if target in ("junos", "nvue") else "!"
        assert rendering.text.endswith("".join(f"{comment}   {v}\n" for v in rendering.verify))


def test_openconfig_queue_counters_parse():
    """An RFC 7951 openconfig-qos document with queue state (counter64 leaves as strings, as the model says)."""
    sample = {"openconfig-qos:qos": {"interfaces": {"interface": [{
        "interface-id": "Ethernet0",
        "output": {"queues": {"queue": [
            {"name": "high", "state": {"name": "high", "transmit-pkts": "1000", "transmit-octets": "1500000",
                                       "dropped-pkts": "0"}},
            {"name": "geryon-control", "state": {"name": "geryon-control", "transmit-pkts": "42",
                                                 "transmit-octets": "5000", "dropped-pkts": "0"}},
            {"name": "low", "state": {"name": "low", "transmit-pkts": "9", "transmit-octets": "900",
                                      "dropped-pkts": "7"}}]}}}]}}}
    parsed = parse_queue_counters(json.dumps(sample))["Ethernet0"]
    assert (parsed["high"].packets, parsed["high"].bytes, parsed["low"].dropped_packets) == (1000, 1500000, 7)
    assert parsed["geryon-control"].packets == 42
    # with the queues' ids (as geryon's own rendering declares them) each queue is keyed by its number,
    # which is how `geryon cluster check` looks a class's queue up
    sample["openconfig-qos:qos"]["queues"] = {"queue": [
        {"name": "high", "config": {"name": "high", "queue-id": 6}},
        {"name": "geryon-control", "config": {"name": "geryon-control", "queue-id": 7}},
        {"name": "low", "config": {"name": "low", "queue-id": 0}}]}
    by_number = parse_queue_counters(json.dumps(sample))["Ethernet0"]
    assert (by_number[6].packets, by_number[7].packets, by_number[0].dropped_packets) == (1000, 42, 7)


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_class_specs_render_on_every_target_up_to_five_classes(count):
    """`--classes N` lands clear of the default-lossless queues and of network control's queue 7."""
    from geryon.netconf.qos_profile import profile_from_classes
    prof = profile_from_classes(count)
    for target in TARGETS:
        assert render(prof, target).profile.classes[0].queue == (7 if target == "linux" else 6)
    assert not {c.queue for c in prof.classes} & {3, 4}


@pytest.mark.parametrize("count", [6, 7])
def test_six_and_seven_classes_fit_the_targets_without_default_lossless_queues(count):
    from geryon.netconf.qos_profile import profile_from_classes
    prof = profile_from_classes(count)
    for target in ("eos", "nvue", "openconfig", "linux"):
        assert [c.queue for c in render(prof, target).profile.classes][0] == (7 if target == "linux" else 6)
    with pytest.raises(TargetLimitError, match="lossy but queue 4 is lossless"):
        render(prof, "sonic")
