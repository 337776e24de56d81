"""Renderers: golden files for the built-ins, the documented syntax of each vendor, one test per hazard,
and the SONiC and OpenConfig output validated by yanglint against the models vendored in tests/yang."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from qos_golden import CASES, golden_path, rendering
from geryon.errors import TargetLimitError
from geryon.netconf.qos_profile import QosClass, QosProfile, validate_profile
from geryon.netconf.render import render

YANG = Path(__file__).resolve().parent / "yang"  # vendored models, see tests/yang/README.md


@pytest.mark.parametrize("target, count, fmt", CASES)
def test_golden(target, count, fmt):
    assert rendering(target, count, fmt).text == golden_path(target, count, fmt).read_text(), \
        "rendering changed: review it, then run `python tests/qos_golden.py`"


def test_sonic_tables_cover_every_dscp_and_bind_every_port():
    data = rendering("sonic", "4", "native").data
    assert set(data) == {"DSCP_TO_TC_MAP", "TC_TO_QUEUE_MAP", "SCHEDULER", "QUEUE", "PORT_QOS_MAP"}
    dscp = data["DSCP_TO_TC_MAP"]["GERYON"]
    assert sorted(map(int, dscp)) == list(range(64)) and all(isinstance(v, str) for v in dscp.values())
    assert dscp["46"] == "6" and dscp["34"] == "5" and dscp["18"] == "2" and dscp["1"] == "0"  # 7: control
    assert data["SCHEDULER"]["GERYON_Q6"] == {"type": "STRICT"}
    assert data["SCHEDULER"]["GERYON_Q0"] == {"type": "DWRR", "weight": "20"}
    assert data["QUEUE"]["Ethernet4|6"] == {"scheduler": "GERYON_Q6"}
    assert data["QUEUE"]["Ethernet4|7"] == {"scheduler": "GERYON_CONTROL"}
    assert data["PORT_QOS_MAP"]["Ethernet0"] == {"dscp_to_tc_map": "GERYON", "tc_to_queue_map": "GERYON"}


def test_sonic_hazard_dscp46_lands_in_a_strict_queue():
    """Stock SONiC (AZURE) sends DSCP 46 to TC 5, a DWRR queue; ours must send it to a STRICT scheduler."""
    data = rendering("sonic", "2", "native").data
    tc = data["DSCP_TO_TC_MAP"]["GERYON"]["46"]
    queue = data["TC_TO_QUEUE_MAP"]["GERYON"][tc]
    assert data["SCHEDULER"][data["QUEUE"][f"Ethernet0|{queue}"]["scheduler"]]["type"] == "STRICT"


def test_eos_syntax_and_sand_queue7_hazard():
    text = rendering("eos", "2", "native").text
    assert "qos map dscp 46 to traffic-class 6\n" in text  # queue 7 reserved on Sand: urgent on 6
    assert "tx-queue 7" not in text
    assert re.search(r"qos profile GERYON\n   qos trust dscp\n   tx-queue 6\n      priority strict\n", text)
    assert "   tx-queue 0\n      no priority\n      bandwidth percent 100\n" in text
    assert "interface Ethernet1\n   service-profile GERYON\n" in text
    maps = [line for line in text.splitlines() if line.startswith("qos map dscp")]
    assert all(len(line.split(" to ")[0].split()) <= 3 + 8 for line in maps)
    taken = validate_profile(QosProfile("t", (QosClass("a", (46,), 7, "strict"),
                                              QosClass("b", (26,), 6, "weighted", 50),
                                              QosClass("c", (0,), 0, "weighted", 50)), "c"))
    with pytest.raises(TargetLimitError, match="queue 7 is reserved"):
        render(taken, "eos")


def test_nxos_syntax_and_percentages_sum_to_100():
    text = rendering("nxos", "4", "native").text
    assert "class-map type qos match-any GERYON-high\n  match dscp 46\n" in text
    assert "  class GERYON-high\n    set qos-group 6\n" in text  # queue 7 is network control's
    assert "class-map type qos match-any GERYON-control\n  match dscp 48,56\n" in text
    assert "policy-map type qos GERYON-IN\n  class GERYON-control\n    set qos-group 7\n" in text
    assert "  class type queuing c-out-8q-q7\n    priority level 1\n" in text
    assert "  class type queuing c-out-8q-q6\n    priority level 2\n" in text
    assert "system qos\n  service-policy type queuing output GERYON-OUT\n" in text
    assert "interface Ethernet1/1\n  service-policy type qos input GERYON-IN\n" in text
    shares = [int(n) for n in re.findall(r"bandwidth remaining percent (\d+)", text)]
    assert len(shares) == 6 and sum(shares) == 100
    assert text.count("class type queuing") == 8
    odd = validate_profile(QosProfile("o", (QosClass("a", (46,), 7, "strict"), QosClass("b", (26,), 5, "weighted", 1),
                                            QosClass("c", (10,), 3, "weighted", 1),
                                            QosClass("d", (0,), 0, "weighted", 1)), "d"))
    assert sum(int(n) for n in re.findall(r"remaining percent (\d+)", render(odd, "nxos").text)) == 100


def test_nvue_syntax_and_default_scheduler_hazard():
    """Every TC is rendered so the default 12/13% DWRR shares of untouched TCs cannot push the sum past 100."""
    text = rendering("nvue", "4", "native").text
    assert text.startswith("nv set qos mapping default-global trust l3\n")
    assert "nv set qos mapping default-global dscp 46 switch-priority 6\n" in text  # 7 is network control's
    assert "nv set qos mapping default-global dscp 48 switch-priority 7\n" in text
    assert "nv set qos mapping default-global dscp 56 switch-priority 7\n" in text
    assert text.count("nv set qos mapping default-global dscp ") == 64
    assert "nv set qos egress-queue-mapping default-global switch-priority 7 traffic-class 7\n" in text
    assert "nv set qos egress-scheduler default-global traffic-class 7 mode strict\n" in text
    assert "nv set qos egress-scheduler default-global traffic-class 6 mode strict\n" in text
    shares = {int(tc): int(p) for tc, p in
              re.findall(r"egress-scheduler default-global traffic-class (\d) bw-percent (\d+)", text)}
    assert set(shares) == set(range(6)) and sum(shares.values()) == 100
    assert all(1 <= p <= 100 for p in shares.values())


def test_junos_syntax_and_qfx_queue7_hazard():
    text = rendering("junos", "2", "native").text
    assert "set class-of-service forwarding-classes class geryon-high queue-num 6\n" in text
    assert "queue-num 7" not in text
    assert ("set class-of-service classifiers dscp GERYON-DSCP forwarding-class geryon-high loss-priority low "
            "code-points [ 101110 ]\n") in text
    assert "set class-of-service schedulers geryon-high-sched priority strict-high\n" in text
    assert text.count("strict-high") == 1
    assert "set class-of-service schedulers geryon-high-sched shaping-rate percent 95\n" in text  # the QFX guard
    assert "set class-of-service schedulers geryon-low-sched transmit-rate percent 95\n" in text
    assert "set class-of-service schedulers geryon-control-sched transmit-rate percent 5\n" in text
    assert "set class-of-service interfaces xe-0/0/0 scheduler-map GERYON-MAP\n" in text
    assert "set class-of-service interfaces xe-0/0/0 unit 0 classifiers dscp GERYON-DSCP\n" in text
    for kind in ("dscp GERYON-DSCP ", "dscp-ipv6 GERYON-DSCP6 "):
        points = re.findall(kind + r".*code-points \[ ([01 ]+) \]", text)
        assert sorted(int(p, 2) for group in points for p in group.split()) == list(range(64))


def test_linux_plan_matches_netconf_layout():
    text = rendering("linux", "4", "native").text
    assert "tc qdisc add dev eth1 root handle 1: htb default 13\n" in text
    assert ("tc class add dev eth1 parent 1:1 classid 1:10 htb rate 9900mbit ceil 10gbit prio 0 quantum 15140 "
            "burst 1239100 cburst 1251600\n") in text
    assert re.search(r"classid 1:11 htb rate 50mbit ceil 10gbit prio 1 quantum 7570 burst 7850 cburst 1251600", text)
    assert "u32 match ip dsfield 0xb8 0xfc flowid 1:10" in text and "match ip6 priority 0x48 0xfc flowid 1:12" in text


def test_openconfig_structure():
    qos = rendering("openconfig", "4", "native").data["openconfig-qos:qos"]
    policy = qos["scheduler-policies"]["scheduler-policy"][0]["schedulers"]["scheduler"]
    assert policy[0]["config"] == {"sequence": 0, "priority": "STRICT"}
    assert policy[0]["inputs"]["input"][0]["id"] == "geryon-control" and policy[1]["config"]["priority"] == "STRICT"
    weights = {i["id"]: i["config"]["weight"] for i in policy[2]["inputs"]["input"]}
    assert weights == {"p1": "50", "p2": "30", "low": "20"}  # uint64: strings in RFC 7951
    terms = qos["classifiers"]["classifier"][0]["terms"]["term"]
    assert sorted(d for t in terms for d in t["conditions"]["ipv4"]["config"]["dscp-set"]) == list(range(64))


# --- yanglint --------------------------------------------------------------------------------------

def yanglint(kind: str, instance: Path, extra_modules=()) -> subprocess.CompletedProcess:
    if not shutil.which("yanglint"):
        pytest.fail("yanglint missing: install Debian package libyang2-tools (scripts/setup.sh does)")
    modules = sorted(str(p) for p in (YANG / "sonic").glob("sonic-*.yang")) if kind == "sonic" \
        else [str(YANG / "openconfig" / "openconfig-qos.yang")]
    return subprocess.run(["yanglint", "-p", str(YANG / kind), "-t", "config", *modules, *extra_modules, str(instance)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("count", ["2", "4"])
def test_sonic_yang_instance_validates(tmp_path, count):
    path = tmp_path / "sonic.json"
    path.write_text(rendering("sonic", count, "yang").text)
    result = yanglint("sonic", path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("count", ["2", "4"])
def test_openconfig_validates(tmp_path, count):
    path = tmp_path / "oc.json"
    path.write_text(rendering("openconfig", count, "native").text)
    result = yanglint("openconfig", path)
    assert result.returncode == 0, result.stderr


def test_yanglint_rejects_a_broken_instance(tmp_path):
    """The validator is really checking: a weight of 0 (outside 1..100) in our own output is refused."""
    data = rendering("sonic", "2", "yang").data
    data["sonic-scheduler:sonic-scheduler"]["SCHEDULER"]["SCHEDULER_LIST"][1]["weight"] = 0
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    result = yanglint("sonic", path)
    assert result.returncode != 0 and "out of the allowed range" in result.stderr


def test_the_yang_models_are_the_vendored_ones_everywhere():
    """No file of the package, the tests or the docs points at the development machines' model copies."""
    root = Path(__file__).resolve().parents[1]
    needle = "/".join(("shared", "yang"))  # spelled so this file does not match itself
    found = [str(p.relative_to(root)) for folder in ("geryon", "tests", "docs") for p in (root / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".toml", ".txt", ".json") and needle in p.read_text()]
    assert found == []
    assert (YANG / "sonic" / "LICENSE.sonic-yang-models").is_file()
    assert (YANG / "openconfig" / "LICENSE.openconfig-public").is_file()
