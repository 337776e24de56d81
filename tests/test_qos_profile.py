"""QoS profiles: TOML, built-ins, --classes specs, and the typed errors raised before anything is touched."""

import pytest

from geryon.errors import QosProfileError, TargetLimitError
from geryon.netconf.qos_profile import (builtin_profile, check_target, load_profile, percentages,
                                    profile_from_classes, resolve_profile)
from geryon.netconf.render import render, target_module

TOML = """
name = "lab"
rate = "100gbit"
ports = ["Ethernet0", "Ethernet4"]

[[class]]
name = "urgent"
dscp = [46, 40]
queue = 6
scheduler = "strict"

[[class]]
name = "bulk"
dscp = [0]
queue = 1
scheduler = "weighted"
weight = 70
default = true

[[class]]
name = "scavenger"
dscp = [8]
queue = 0
weight = 30
"""


def write(tmp_path, text):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_toml_profile_loads_with_default_class_and_rate(tmp_path):
    profile = load_profile(write(tmp_path, TOML))
    assert profile.name == "lab" and profile.rate == 100 * 10**9
    assert profile.ports == ("Ethernet0", "Ethernet4")
    assert [c.name for c in profile.classes] == ["urgent", "bulk", "scavenger"]
    mapping = profile.dscp_map()
    assert mapping[46].name == mapping[40].name == "urgent"
    assert mapping[8].name == "scavenger" and mapping[13].name == "bulk"  # unlisted -> default class
    assert len(mapping) == 64


def test_builtins_and_class_spec():
    two = builtin_profile("two-class")
    assert [(c.name, c.dscps, c.queue, c.scheduler) for c in two.classes] == [
        ("high", (46,), 7, "strict"), ("low", (0,), 0, "weighted")]
    four = builtin_profile("four-class")
    assert [c.queue for c in four.classes] == [7, 5, 2, 0]
    spec = profile_from_classes("high:46,mid:26,low:0")
    assert [(c.name, c.queue, c.scheduler, c.weight) for c in spec.classes] == [
        ("high", 7, "strict", None), ("mid", 5, "weighted", 20), ("low", 0, "weighted", 10)]  # clear of 3 and 4
    assert resolve_profile(classes="high:46,low:0", ports=["eth1"]).ports == ("eth1",)


@pytest.mark.parametrize("change, message", [
    (("dscp = [0]\nqueue = 1", "dscp = [46]\nqueue = 1"), "DSCP 46 is in both class 'urgent' and class 'bulk'"),
    (("dscp = [8]", "dscp = [64]"), "outside 0-63"),
    (("queue = 0\nweight = 30", "queue = 1\nweight = 30"), "both use queue 1"),
    (("queue = 0\nweight = 30", "queue = 0\nweight = 0"), "needs a weight from 1 to 100"),
    (("queue = 0\nweight = 30", "queue = 0\nweight = 101"), "needs a weight from 1 to 100"),
    (('scheduler = "strict"', 'scheduler = "strict"\nweight = 5'), "strict and also has a weight"),
    (('scheduler = "strict"', 'scheduler = "fair"'), "neither 'strict' nor 'weighted'"),
    (("queue = 6", "queue = 0"), "both use queue 0"),
    (("queue = 1\nscheduler", "queue = 7\nscheduler"), "a higher class needs a higher queue"),
    (('name = "lab"', 'name = "lab"\ncolour = "red"'), "unknown key(s) colour"),
    (('rate = "100gbit"', 'rate = "fast"'), "unknown rate"),
])
def test_broken_profiles_are_rejected_with_a_reason(tmp_path, change, message):
    old, new = change
    assert old in TOML
    with pytest.raises(QosProfileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile(write(tmp_path, TOML.replace(old, new, 1)))


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(QosProfileError, match="not valid TOML"):
        load_profile(write(tmp_path, "[[class]\nname="))
    with pytest.raises(QosProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.toml")


def test_strict_below_weighted_is_rejected():
    from geryon.netconf.qos_profile import QosClass, QosProfile, validate_profile
    with pytest.raises(QosProfileError, match="listed below weighted"):
        validate_profile(QosProfile("x", (QosClass("a", (0,), 5, "weighted", 10),
                                          QosClass("b", (46,), 4, "strict")), "a"))


def test_target_limits_strict_queues_and_weights():
    from geryon.netconf.qos_profile import QosClass, QosProfile, validate_profile
    two_strict = validate_profile(QosProfile("x", (QosClass("a", (46,), 6, "strict"), QosClass("b", (40,), 5, "strict"),
                                                   QosClass("c", (0,), 0, "weighted", 100)), "c"))
    for target in ("junos", "nxos"):
        with pytest.raises(TargetLimitError, match="strict queue"):
            render(two_strict, target)
    assert render(two_strict, "sonic").data["SCHEDULER"]["GERYON_Q5"] == {"type": "STRICT"}
    def lopsided(lossless):
        return validate_profile(QosProfile("y", (QosClass("a", (46,), 7, "strict"),
                                                 *(QosClass(f"w{i}", (i + 1,), q, "weighted", 100, lossless=lossless(q))
                                                   for i, q in enumerate((5, 4, 3, 2, 1))),
                                                 QosClass("z", (0,), 0, "weighted", 1)), "z"))
    with pytest.raises(TargetLimitError, match="below 1% of the total"):
        check_target(lopsided(lambda q: False), target_module("nxos").LIMITS)
    # SONiC takes raw DWRR weights 1..100 (its queues 3 and 4 are lossless by default)
    check_target(lopsided(lambda q: q in (3, 4)), target_module("sonic").LIMITS)


def test_percentages_sum_to_100():
    assert percentages([50, 30, 20]) == [50, 30, 20]
    assert sum(percentages([1, 1, 1])) == 100 and percentages([1, 1, 1]) == [34, 33, 33]
    assert sum(percentages([7, 13, 29, 51, 3])) == 100


def test_cli_render_profile_error_is_typed(tmp_path, capsys):
    from geryon.cli import main
    bad = write(tmp_path, TOML.replace("dscp = [0]\nqueue = 1", "dscp = [46]\nqueue = 1"))
    assert main(["netconf", "render", "--profile", str(bad), "--target", "sonic"]) == 1
    assert "DSCP 46 is in both" in capsys.readouterr().err


def test_shipped_examples_load():
    from pathlib import Path
    from geryon.cluster.inventory import load_inventory
    root = Path(__file__).resolve().parents[1] / "cluster"
    inventory = load_inventory(root / "lab.toml")
    assert inventory.profile.name == "geryon-3" and inventory.switches[0].kind == "sonic"
    assert inventory.port_toward("node2")[1] == "Ethernet4"
    for target in ("sonic", "eos", "nxos", "nvue", "junos", "openconfig", "linux"):
        render(load_profile(root / "profiles" / "three-class.toml"), target)
