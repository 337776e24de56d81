"""The pure-ACK class of QoS profiles (`ack_priority = off|top|own`): parsing and its errors, golden output
per target, what each target can and cannot match (refusals and warnings), OpenConfig validated by yanglint
against the models vendored in tests/yang, the Linux rendering accepted by tc in a namespace, and the EOS
session (apply, read back, idempotent) through a real sshd stand-in."""

import json
import re
import subprocess
from dataclasses import replace

import pytest

from sshd_support import forced_command_sshd
from qos_golden import ACK_CASES, ACK_OWN_PROFILE, PORTS, ack_golden_path, ack_profile, ack_rendering
from test_qos_render import YANG, yanglint
from test_qos_vendor_session import fake_switch  # noqa: F401  (the sshd stand-in fixture)
from geryon.cli import main
from geryon.errors import QosProfileError, TargetLimitError
from geryon.netconf.plan import ROOT, AckFilterOp, build_priority_plan
from geryon.netconf.qos_profile import builtin_profile, load_profile, resolve_profile, validate_profile
from geryon.netconf.render import render
from geryon.netconf.render.linux import build_plan
from geryon.netconf.session import build_session

TOML = """
name = "lab"
{ack}
[[class]]
name = "high"
dscp = [46]
queue = {queue}
scheduler = "strict"

[[class]]
name = "low"
dscp = [0]
queue = 0
weight = 100
"""


def profile_text(tmp_path, ack: str = "", queue: int = 5):
    path = tmp_path / "p.toml"
    path.write_text(TOML.format(ack=ack, queue=queue))
    return path


# --- the profile option ------------------------------------------------------------------------------

def test_ack_priority_defaults_to_off_and_parses_each_mode(tmp_path):
    assert load_profile(profile_text(tmp_path)).ack_priority == "off"
    assert load_profile(profile_text(tmp_path)).ack_queue is None
    top = load_profile(profile_text(tmp_path, 'ack_priority = "top"'))
    assert (top.ack_priority, top.ack_queue) == ("top", 5)
    own = load_profile(profile_text(tmp_path, 'ack_priority = "own"'))
    assert (own.ack_priority, own.ack_queue, own.ack_own) == ("own", 6, True)
    assert builtin_profile("two-class").ack_priority == "off"  # existing profiles render as before
    assert resolve_profile("two-class", ack_priority="top").ack_queue == 7
    assert resolve_profile(str(ACK_OWN_PROFILE), ack_priority="off").ack_priority == "off"


@pytest.mark.parametrize("ack, queue, message", [
    ('ack_priority = "yes"', 5, "ack_priority 'yes' of profile 'lab': give one of 'off', 'top', 'own'"),
    ('ack_priority = "OWN"', 5, "give one of 'off', 'top', 'own'"),
    ("ack_priority = true", 5, "ack_priority must be a string"),
    ("ack_priority = 1", 5, "ack_priority must be a string"),
    ('ack_priority = "own"', 7, "class 'high' of profile 'lab' is on queue 7, the highest: move the classes down"),
])
def test_bad_ack_priority_is_a_clear_profile_error(tmp_path, ack, queue, message):
    with pytest.raises(QosProfileError, match=re.escape(message)):
        load_profile(profile_text(tmp_path, ack, queue))


def test_override_is_validated_too():
    with pytest.raises(QosProfileError, match="one queue above the top class"):
        resolve_profile("two-class", ack_priority="own")
    with pytest.raises(QosProfileError, match="give one of"):
        validate_profile(replace(builtin_profile("two-class"), ack_priority="both"))


# --- renderings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, mode", ACK_CASES)
def test_ack_golden(target, mode):
    assert ack_rendering(target, mode).text == ack_golden_path(target, mode).read_text(), \
        "rendering changed: review it, then run `python tests/qos_golden.py`"


@pytest.mark.parametrize("target", ["sonic", "nvue"])
@pytest.mark.parametrize("mode", ["top", "own"])
def test_targets_without_a_length_match_refuse_and_say_why(target, mode):
    """A flags-only match would take bulk data segments sent without PSH: refused, never dropped silently."""
    with pytest.raises(TargetLimitError, match=r"no packet-length .*bulk data segment.*ack_priority = 'off'"):
        render(ack_profile(target, mode), target)


@pytest.mark.parametrize("target", ["junos", "nxos"])
def test_one_strict_queue_targets_refuse_own(target):
    with pytest.raises(TargetLimitError, match=r"allows 1 strict queue.*use ack_priority = 'top'"):
        render(ack_profile(target, "own"), target)


def test_eos_own_refused_when_the_ack_queue_would_be_reserved_queue_7(tmp_path):
    profile = load_profile(profile_text(tmp_path, 'ack_priority = "own"', queue=6))
    with pytest.raises(TargetLimitError, match=r"pure ACKs on queue 7, which is reserved.*queue 5 or lower"):
        render(profile, "eos")
    assert "traffic class 6" in render(load_profile(profile_text(tmp_path, 'ack_priority = "own"', 5)), "eos").text


@pytest.mark.parametrize("target, mode", [c for c in ACK_CASES if c[0] != "linux"])
def test_approximate_targets_warn_in_notes_and_in_the_rendering(target, mode):
    rendering = ack_rendering(target, mode)
    assert any(note.startswith(f"WARNING: pure-ACK match on {target} is approximate") for note in rendering.notes)
    if target != "openconfig":  # JSON has no comments: the notes carry it (stderr, and --json)
        assert re.search(r"^[!#] (APPROXIMATE match|WARNING): ", rendering.text, re.M)
        assert not any(line.startswith(("!", "#")) for line in rendering.commands)  # comments are never sent


def test_linux_filters_are_the_emulated_cluster_ones():
    """The renderer's ACK filters, classes and prios are geryon netconf's own plan for the same classes."""
    for mode in ("top", "own"):
        profile = replace(builtin_profile("two-class"), ack_priority=mode, classes=(
            replace(builtin_profile("two-class").classes[0], queue=6), builtin_profile("two-class").classes[1]))
        rendered = build_plan(validate_profile(replace(profile, rate=10**9)), "eth1")
        emulated = build_priority_plan("eth1", "high:46,low:0", 10**9, ack_priority=mode)
        acks = [op for op in rendered.ops if isinstance(op, AckFilterOp)]
        assert acks == [op for op in emulated.ops if isinstance(op, AckFilterOp)]
        assert acks[0].flowid == ("1:f" if mode == "own" else "1:10") and acks[0].parent == ROOT
    assert not [op for op in build_plan(builtin_profile("two-class"), "eth1").ops if isinstance(op, AckFilterOp)]


def test_eos_traffic_policy_on_every_port_and_own_queue_shaped():
    text = ack_rendering("eos", "own").text
    assert "   tx-queue 6\n      priority strict\n      shape rate 5 percent\n" in text
    assert "qos map traffic-class 6 to tx-queue 6\n" in text
    assert re.search(r"match geryon-pure-ack ipv4\n +protocol tcp flags ack\n +ip length 20-127\n +actions\n"
                     r" +set traffic class 6\n", text)
    assert "interface Ethernet1\n   service-profile GERYON\n   traffic-policy input GERYON-ACK\n" in text


def test_junos_filter_matches_exactly_ack_and_length():
    text = ack_rendering("junos", "top").text
    term = "set firewall family inet filter GERYON-ACK term pure-ack"
    assert f'{term} from tcp-flags "ack & !syn & !fin & !rst & !push & !urgent"\n' in text
    assert f"{term} from packet-length 0-127\n" in text and f"{term} from protocol tcp\n" in text
    assert f"{term} then forwarding-class geryon-high\n" in text  # queue 6 on Junos (7 is network-control)
    assert "set firewall family inet filter GERYON-ACK term rest then accept\n" in text
    assert "set interfaces xe-0/0/0 unit 0 family inet filter input GERYON-ACK\n" in text


def test_nxos_ack_class_comes_before_the_classes_after_network_control():
    text = ack_rendering("nxos", "top").text
    assert "ip access-list GERYON-ACK\n  10 permit tcp any any ack packet-length lt 128\n" in text
    assert "class-map type qos match-any GERYON-PURE-ACK\n  match access-group name GERYON-ACK\n" in text
    assert ("policy-map type qos GERYON-IN\n  class GERYON-control\n    set qos-group 7\n  class GERYON-PURE-ACK\n"
            "    set qos-group 6\n  class GERYON-high\n") in text  # the top class moved to 6 below control


def test_openconfig_terms_cover_every_pure_ack_length():
    qos = ack_rendering("openconfig", "own").data["openconfig-qos:qos"]
    v4, v6 = qos["classifiers"]["classifier"]
    acks = [t for t in v4["terms"]["term"] if t["id"].startswith("pure-ack-")]
    assert [t["conditions"]["ipv4"]["config"]["length"] for t in acks] == [40, 52, 60, 64, 68, 72, 76, 80]
    assert {t["actions"]["config"]["target-group"] for t in acks} == {"fg-geryon-ack"}
    assert all(t["conditions"]["transport"]["config"]["explicit-tcp-flags"] ==
               ["openconfig-packet-match-types:TCP_ACK"] for t in acks)
    assert max(t["conditions"]["ipv6"]["config"]["length"] for t in v6["terms"]["term"]
               if t["id"].startswith("pure-ack-")) == 60
    control, ack = qos["scheduler-policies"]["scheduler-policy"][0]["schedulers"]["scheduler"][:2]
    assert control["inputs"]["input"][0]["id"] == "geryon-control"  # network control first, then the ACKs
    assert ack["config"]["priority"] == "STRICT" and ack["one-rate-two-color"]["config"]["cir-pct"] == 5
    assert ack["inputs"]["input"][0]["id"] == "geryon-ack" and ack["sequence"] == 1
    assert {"name": "geryon-ack", "config": {"name": "geryon-ack", "queue-id": 6}} in qos["queues"]["queue"]


# --- yanglint --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["top", "own"])
def test_openconfig_with_ack_class_validates(tmp_path, mode):
    path = tmp_path / "oc.json"
    path.write_text(ack_rendering("openconfig", mode).text)
    # identities (TCP_ACK, ONE_RATE_TWO_COLOR) need their modules implemented, not only imported
    extra = [str(YANG / "openconfig" / f) for f in ("openconfig-packet-match-types.yang", "openconfig-qos-types.yang")]
    result = yanglint("openconfig", path, extra)
    assert result.returncode == 0, result.stderr


def test_yanglint_rejects_a_broken_ack_term(tmp_path):
    data = ack_rendering("openconfig", "top").data
    term = data["openconfig-qos:qos"]["classifiers"]["classifier"][0]["terms"]["term"][0]
    term["conditions"]["ipv4"]["config"]["length"] = 70000  # uint16
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    extra = [str(YANG / "openconfig" / f) for f in ("openconfig-packet-match-types.yang", "openconfig-qos-types.yang")]
    result = yanglint("openconfig", path, extra)
    assert result.returncode != 0 and "length" in result.stderr


# --- the command line, tc and the SSH session -------------------------------------------------------

def test_render_command_line(capsys):
    assert main(["netconf", "render", "--profile", "two-class", "--target", "nxos", "--ack-priority", "top"]) == 0
    captured = capsys.readouterr()
    assert "set qos-group 7" in captured.out and "WARNING: pure-ACK match on nxos" in captured.err
    assert main(["netconf", "render", "--profile", "two-class", "--target", "sonic", "--ack-priority", "own"]) == 1
    assert "move the classes down one queue" in capsys.readouterr().err
    assert main(["netconf", "render", "--profile", str(ACK_OWN_PROFILE), "--target", "sonic"]) == 1
    assert "sonic cannot give pure ACKs a queue" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["netconf", "render", "--profile", "two-class", "--target", "eos", "--ack-priority", "yes"])


@pytest.mark.root
def test_linux_rendering_is_accepted_by_tc(unique_name):
    """Every rendered tc line of the "own" profile runs in a namespace, and the ACK filters are there."""
    netns = f"gy{unique_name}q"
    profile = load_profile(ACK_OWN_PROFILE).with_ports(["gyd0"])
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "add", "gyd0", "type", "veth", "peer", "name", "gyd1"], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "gyd0", "up"], check=True)
        for line in render(profile, "linux").commands:
            if " || true" not in line:
                subprocess.run(["ip", "netns", "exec", netns, *line.split()], check=True, capture_output=True)
        out = subprocess.run(["ip", "netns", "exec", netns, "tc", "filter", "show", "dev", "gyd0"],
                             check=True, capture_output=True, text=True).stdout
        assert len(re.findall(r"pref 1 u32 .*\n(?:.*\n)*?.*flowid 1:f", out)) >= 1
        assert "pref 2 u32" in out and "pref 3 u32" in out and "pref 4 u32" in out
        classes = subprocess.run(["ip", "netns", "exec", netns, "tc", "class", "show", "dev", "gyd0"],
                                 check=True, capture_output=True, text=True).stdout
        assert re.search(r"class htb 1:f parent 1:1 (leaf f: )?prio 0 ", classes)
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


@pytest.mark.root
def test_eos_session_with_ack_class_applies_reads_back_and_is_idempotent(fake_switch, capsys):  # noqa: F811
    folder, port = fake_switch
    args = ["netconf", "apply", "--profile", "two-class", "--ack-priority", "top", "--target",
            f"eos@root@127.0.0.1:{port}", "--ports", "Ethernet1", "--known-hosts", str(folder / "known_hosts"),
            "--key", str(folder / "client"), "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] and result["steps"][-2:] == ["read back: matches", "confirm"]
    log = (folder / "commands.log").read_text()
    assert "   traffic-policy input GERYON-ACK\n" in log and "set traffic class 6" in log
    assert "APPROXIMATE" not in log  # the comments stay out of the session
    assert main(args) == 0
    assert not json.loads(capsys.readouterr().out)["changed"]
    assert main([*args, "--dry-run"]) == 0
    assert "traffic-policies" in "\n".join(json.loads(capsys.readouterr().out)["diff"])


def test_junos_and_nxos_sessions_read_back_the_filter_hierarchies():
    for target, readback in (("junos", "show configuration | display set"), ("nxos", "show running-config")):
        rendering = ack_rendering(target, "top")
        session = build_session(rendering.profile, rendering)
        assert session.readback.command == readback
        assert any("GERYON-ACK" in line for line in session.expected)
    plain = render(builtin_profile("two-class").with_ports(PORTS["junos"]), "junos")
    assert build_session(plain.profile, plain).readback.command == "show configuration class-of-service | display set"


LINUX_HOST = """#!/bin/sh
exec ip netns exec {netns} sh -c "$SSH_ORIGINAL_COMMAND"
"""


@pytest.fixture
def linux_host(tmp_path, unique_name, monkeypatch):
    """A "Linux host" behind a real sshd: every command runs in a namespace with a veth gyd0 (no qdisc)."""
    from geryon import envvars

    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path / "state"))
    netns = f"gy{unique_name}h"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "add", "gyd0", "type", "veth", "peer", "name", "gyd1"], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "gyd0", "up"], check=True)
        with forced_command_sshd(tmp_path, LINUX_HOST.format(netns=netns)) as port:
            yield tmp_path, port, netns
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def tc_dump(netns: str) -> list[str]:
    return [subprocess.run(["ip", "netns", "exec", netns, "tc", *what, "show", "dev", "gyd0"], check=True,
                           capture_output=True, text=True).stdout for what in (["qdisc"], ["-d", "class"], ["filter"])]


@pytest.mark.root
def test_linux_apply_over_ssh_with_ack_class_dry_run_read_back_restore(linux_host, capsys):
    """`netconf apply --target linux@...` with the "own" profile: dry run changes nothing, apply reads back the
    ACK filters, a second apply changes nothing, `restore` puts the device back as it was."""
    folder, port, netns = linux_host
    common = ["--target", f"linux@root@127.0.0.1:{port}", "--ports", "gyd0", "--known-hosts",
              str(folder / "known_hosts"), "--key", str(folder / "client"), "--json"]
    apply = ["netconf", "apply", "--profile", str(ACK_OWN_PROFILE), "--rate", "1gbit", *common]
    before = tc_dump(netns)
    assert main([*apply, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert not dry["changed"] and any("flowid 1:f" in line or "1:f" in line for line in dry["diff"])
    assert tc_dump(netns) == before
    assert main(apply) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["changed"] and "read back gyd0: matches" in done["steps"]
    filters = tc_dump(netns)[2]
    assert filters.count("flowid 1:f") == 2 and "pref 3 u32" in filters
    assert main(apply) == 0 and not json.loads(capsys.readouterr().out)["changed"]
    assert main(["netconf", "restore", *common]) == 0
    capsys.readouterr()
    assert tc_dump(netns)[1:] == before[1:] and "htb" not in tc_dump(netns)[0]
