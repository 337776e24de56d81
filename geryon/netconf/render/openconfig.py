"""OpenConfig QoS: the profile as an RFC 7951 JSON instance of `openconfig-qos`.

Follows the openconfig-qos model (openconfig/public, release/models/qos: openconfig-qos-elements and
openconfig-qos-interfaces, 2.x) as published in the OpenConfig QoS documentation: classifiers with terms
matching `dscp-set`, forwarding-groups pointing at output queues, one scheduler-policy whose sequence 0..k
are the strict queues (priority STRICT) and whose last sequence holds the weighted queues, and per
interface the input classifiers and output scheduler-policy.

Hazards:
  - `priority` has one value, STRICT; strict queues are ordered by scheduler `sequence`, lowest first.
  - Input `weight` is a uint64 and must be a JSON *string* in RFC 7951 ("40", not 40); `queue-id` and
    `dscp` are uint8 and must be numbers.
  - A term may carry `dscp` or `dscp-set`, never both; the default class's term lists every DSCP no
    other class claims, so all 64 are classified.
  - IPv4 and IPv6 need separate classifiers (type IPV4 / IPV6); both are rendered.
"""

from geryon.netconf.profile import QosProfile, TargetLimits
from geryon.netconf.render import Rendering, dump_json

LIMITS = TargetLimits("openconfig", max_strict=8)
DEFAULT_PORTS = ("eth0",)
POLICY = "geryon-sched"


def _dscps(profile: QosProfile) -> dict[str, list[int]]:
    by_class: dict[str, list[int]] = {cls.name: [] for cls in profile.classes}
    for dscp, cls in sorted(profile.dscp_map().items()):
        by_class[cls.name].append(dscp)
    return by_class


def _classifier(profile: QosProfile, family: str) -> dict:
    name = f"geryon-{family.lower()}"
    key = family.lower()
    terms = []
    for cls, dscps in zip(profile.classes, _dscps(profile).values()):
        if dscps:
            terms.append({"id": cls.name, "config": {"id": cls.name},
                          "conditions": {key: {"config": {"dscp-set": dscps}}},
                          "actions": {"config": {"target-group": f"fg-{cls.name}"}}})
    return {"name": name, "config": {"name": name, "type": family}, "terms": {"term": terms}}


def _scheduler_policy(profile: QosProfile) -> dict:
    schedulers = []
    for sequence, cls in enumerate(profile.strict_classes):
        schedulers.append({"sequence": sequence, "config": {"sequence": sequence, "priority": "STRICT"},
                           "inputs": {"input": [_input(cls)]}})
    if profile.weighted:
        sequence = len(schedulers)
        schedulers.append({"sequence": sequence, "config": {"sequence": sequence},
                           "inputs": {"input": [_input(cls) for cls in profile.weighted]}})
    return {"name": POLICY, "config": {"name": POLICY}, "schedulers": {"scheduler": schedulers}}


def _input(cls) -> dict:
    config = {"id": cls.name, "input-type": "QUEUE", "queue": cls.name}
    if not cls.strict:
        config["weight"] = str(cls.weight)
    return {"id": cls.name, "config": config}


def instance(profile: QosProfile) -> dict:
    ports = profile.ports or DEFAULT_PORTS
    queues = [{"name": c.name, "config": {"name": c.name, "queue-id": c.queue}} for c in profile.classes]
    groups = [{"name": f"fg-{c.name}", "config": {"name": f"fg-{c.name}", "output-queue": c.name}}
              for c in profile.classes]
    interfaces = [{
        "interface-id": port, "config": {"interface-id": port},
        "input": {"classifiers": {"classifier": [
            {"type": family, "config": {"type": family, "name": f"geryon-{family.lower()}"}}
            for family in ("IPV4", "IPV6")]}},
        "output": {"scheduler-policy": {"config": {"name": POLICY}},
                   "queues": {"queue": [{"name": c.name, "config": {"name": c.name}} for c in profile.classes]}},
    } for port in ports]
    return {"openconfig-qos:qos": {
        "queues": {"queue": queues},
        "forwarding-groups": {"forwarding-group": groups},
        "classifiers": {"classifier": [_classifier(profile, "IPV4"), _classifier(profile, "IPV6")]},
        "scheduler-policies": {"scheduler-policy": [_scheduler_policy(profile)]},
        "interfaces": {"interface": interfaces},
    }}


def render(profile: QosProfile) -> Rendering:
    data = instance(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    return Rendering("openconfig", profile, dump_json(data), data, notes)
