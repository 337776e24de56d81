"""Tenants: jobs sharing a fabric compile to fabric classes that every target renders (goldens), keep the
switch rules (network control on its own queue, no lossy class on the lossless queues), and the launcher
puts each job's classes on its level's DSCPs."""

import json

import pytest

from qos_golden import TENANTS_PROFILE, tenants_golden_path, tenants_rendering
from geryon.errors import ConfigError, QosProfileError
from geryon.launch.config import parse_launch_args
from geryon.netconf.qos_profile import (CONTROL_DSCPS, PLATFORM_LOSSLESS_QUEUES, QosClass, QosProfile, load_profile,
                                    validate_profile)
from geryon.netconf.render import TARGETS, render
from geryon.netconf.tenants import (BACKGROUND_DSCP, Tenant, Tenants, load_tenants, tenant_class_spec,
                                    tenant_profile)
from launch_support import REPO

SCRIPT = str(REPO / "examples" / "train_cnn.py")


def summary(profile):
    return [(c.name, c.dscps, c.queue, c.scheduler, c.weight) for c in profile.classes]


def test_equal_jobs_share_one_urgent_class_above_bulk_above_background():
    profile = tenant_profile(Tenants("f", (Tenant("a"), Tenant("b"))))
    assert summary(profile) == [("urgent", (46,), 7, "strict", None), ("bulk", (0,), 5, "weighted", 90),
                                ("background", (BACKGROUND_DSCP,), 0, "weighted", 10)]
    assert profile.default_class == "bulk"  # unmarked traffic (vanilla jobs) is bulk, not background
    assert profile.dscp_map()[BACKGROUND_DSCP].name == "background"
    tenants = Tenants("f", (Tenant("a"), Tenant("b")))
    assert tenant_class_spec(tenants, "a") == tenant_class_spec(tenants, "b") == "high:46,low:0"


def test_job_weights_give_the_heaviest_job_the_strict_level():
    tenants = Tenants("f", (Tenant("light", 1), Tenant("heavy", 4), Tenant("mid", 2), Tenant("mid2", 2)),
                      background_percent=20)
    profile = tenant_profile(tenants)
    assert summary(profile) == [("urgent1", (46,), 7, "strict", None), ("urgent2", (34,), 5, "weighted", 27),
                                ("urgent3", (26,), 2, "weighted", 13), ("bulk", (0,), 1, "weighted", 40),
                                ("background", (8,), 0, "weighted", 20)]
    assert [tenant_class_spec(tenants, n) for n in ("heavy", "mid", "mid2", "light")] == [
        "high:46,low:0", "high:34,low:0", "high:34,low:0", "high:26,low:0"]
    assert not {c.queue for c in profile.classes} & set(PLATFORM_LOSSLESS_QUEUES)


@pytest.mark.parametrize("tenants, message", [
    (Tenants("f", (Tenant("a", 1), Tenant("b", 2), Tenant("c", 3), Tenant("d", 4))), "room for 3 urgent levels"),
    (Tenants("f", (Tenant("a"), Tenant("a"))), "listed twice"),
    (Tenants("f", (Tenant("a", 0),)), "positive number"),
    (Tenants("f", (Tenant("a"),), background_percent=60), "from 1 to 50"),
    (Tenants("f", ()), "no \\[\\[tenant\\]\\]"),
])
def test_bad_tenants_say_what_to_change(tenants, message):
    with pytest.raises(QosProfileError, match=message):
        tenant_profile(tenants)


@pytest.mark.parametrize("target", TARGETS)
def test_golden_every_target(target):
    assert tenants_rendering(target).text == tenants_golden_path(target).read_text(), \
        "rendering changed: review it, then run `python tests/qos_golden.py`"


def test_sonic_keeps_control_on_queue7_and_lossless_queues_free():
    data = tenants_rendering("sonic").data
    dscp, queue = data["DSCP_TO_TC_MAP"]["GERYON"], data["TC_TO_QUEUE_MAP"]["GERYON"]
    to_queue = {int(d): int(queue[tc]) for d, tc in dscp.items()}
    assert all(to_queue[d] == 7 for d in CONTROL_DSCPS)
    assert to_queue[46] == 6 and to_queue[34] == 5 and to_queue[0] == 2 and to_queue[BACKGROUND_DSCP] == 0
    trained = {d: q for d, q in to_queue.items() if q in PLATFORM_LOSSLESS_QUEUES}
    assert trained == {3: 3, 4: 4}  # only the platform's own lossless DSCPs stay there (RoCE, kept as found)
    assert data["SCHEDULER"]["GERYON_Q6"] == {"type": "STRICT"}
    assert data["SCHEDULER"]["GERYON_Q0"] == {"type": "DWRR", "weight": "10"}
    json.dumps(data)


def test_linux_guarantees_background_its_share_under_the_strict_class():
    text = tenants_rendering("linux").text  # 10 gbit (no rate in the file), background_percent 10
    assert "match ip dsfield 0x20 0xfc flowid 1:13" in text  # DSCP 8 -> background, the fourth class
    assert "match ip dsfield 0xb8 0xfc flowid 1:10" in text  # EF -> the strict level
    assert "classid 1:13 htb rate 1gbit ceil 10gbit prio 1" in text  # its floor: HTB serves it first
    assert "classid 1:10 htb rate 8910mbit ceil 10gbit prio 0" in text  # the floors come out of the top's


def test_switches_say_the_floor_is_a_weight_there():
    notes = tenants_rendering("sonic").notes
    assert any("min_share 10% is not guaranteed on sonic" in note for note in notes)
    assert not any("min_share" in note for note in tenants_rendering("linux").notes)


@pytest.mark.parametrize("cls, message", [
    (QosClass("a", (46,), 7, "strict", min_share=5), "strict and has a min_share"),
    (QosClass("a", (46,), 7, "weighted", 10, min_share=60), "from 1 to 50"),
])
def test_min_share_only_on_weighted_classes_and_bounded(cls, message):
    with pytest.raises(QosProfileError, match=message):
        validate_profile(QosProfile("p", (cls, QosClass("b", (0,), 0, "weighted", 10)), "b"))
    with pytest.raises(QosProfileError, match="add up to 60%"):
        validate_profile(QosProfile("p", (QosClass("a", (46,), 7, "weighted", 10, min_share=30),
                                          QosClass("b", (0,), 0, "weighted", 10, min_share=30)), "b"))


def test_tenants_file_is_a_profile_for_every_command():
    assert load_profile(TENANTS_PROFILE) == tenant_profile(load_tenants(TENANTS_PROFILE))
    render(load_profile(TENANTS_PROFILE), "nxos")  # one strict queue: the lighter job's level is weighted


def test_launcher_puts_each_job_on_its_level(tmp_path):
    heavy = parse_launch_args(["--local", "--tenants", str(TENANTS_PROFILE), "--tenant", "vgg19-ps", SCRIPT],
                              environ={})
    light = parse_launch_args(["--local", SCRIPT],
                              environ={"GERYON_TENANTS": str(TENANTS_PROFILE), "GERYON_TENANT": "resnet50-ring"})
    assert (heavy.classes, light.classes) == ("high:46,low:0", "high:34,low:0")
    with pytest.raises(ConfigError, match="go together"):
        parse_launch_args(["--local", "--tenant", "vgg19-ps", SCRIPT], environ={})
    with pytest.raises(ConfigError, match="drop --classes"):
        parse_launch_args(["--local", "--tenants", str(TENANTS_PROFILE), "--tenant", "vgg19-ps",
                           "--classes", "3", SCRIPT], environ={})
    with pytest.raises(QosProfileError, match="no tenant 'bert'"):
        parse_launch_args(["--local", "--tenants", str(TENANTS_PROFILE), "--tenant", "bert", SCRIPT], environ={})
