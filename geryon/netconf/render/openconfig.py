"""OpenConfig QoS: the profile as an RFC 7951 JSON instance of `openconfig-qos`.

Follows the openconfig-qos model (openconfig/public, release/models/qos: openconfig-qos-elements and
openconfig-qos-interfaces, 2.x) as published in the OpenConfig QoS documentation: classifiers with terms
matching `dscp-set`, forwarding-groups pointing at output queues, one scheduler-policy whose sequence 0..k
are the strict queues (priority STRICT) and whose last sequence holds the weighted queues, and per
interface the input classifiers and output scheduler-policy.

Pure ACKs (`ack_priority`), with the match fields of openconfig-packet-match (used by the classifier terms'
`conditions`; https://github.com/openconfig/public/blob/master/release/models/acl/openconfig-packet-match.yang):
`ipv4`/`ipv6` `protocol` IP_TCP and `length` (IPv4 total length / IPv6 payload length), `transport`
`detail-mode` EXPLICIT, `explicit-detail-match-mode` ALL, `explicit-tcp-flags` [TCP_ACK]. The model has
neither a length range nor "no other flag", so one term per pure-ACK size is rendered (IPv4 40 + TCP
options of 0, 12 timestamps, 12/20/28/36 SACK, 24/32/40 timestamps + SACK bytes; IPv6 20 less), with ACK
required and the other flags unchecked. Target: the top class's forwarding group ("top"), or a queue
`geryon-ack` one above it served first (scheduler sequence 0, STRICT, ONE_RATE_TWO_COLOR with
cir-pct ACK_SHARE_PERCENT) ("own"). Hazard: classifier terms carry no order in openconfig-qos, so a
device may classify a pure ACK by its DSCP term instead: check the platform's term precedence.

Safe on a production fabric:
  - Network control: CS6 and CS7 (48, 56) get a term `geryon-control` in both classifiers, forwarding group
    `fg-geryon-control` and queue `geryon-control` (queue-id 7), served first (scheduler sequence 0,
    STRICT), so a saturated strict class cannot starve routing protocols; a class on queue 7 moves to 6.
    The model documents no vendor recommendation for a shaper on strict schedulers, so none is rendered.
  - Lossless: openconfig-qos has no PFC leaves, so no queue is reserved and lossless classes are refused.
  - IPv4 and IPv6: one classifier per family (type IPV4 / IPV6), the same terms in each.
  - Only geryon's own named queues, groups, classifiers, scheduler policy and the listed interfaces are
    in the instance: push it with gNMI Set `update`, not `replace`, so the rest of the tree stays.
  - Verification: gNMI Get of `/qos/interfaces/interface[interface-id=<port>]/output/queues` (the
    queue `state` leaves transmit-pkts, transmit-octets, dropped-pkts of openconfig-qos-interfaces),
    in `verify`; `parse_queue_counters` reads its RFC 7951 JSON.

Hazards:
  - `priority` has one value, STRICT; strict queues are ordered by scheduler `sequence`, lowest first.
  - Input `weight` is a uint64 and must be a JSON *string* in RFC 7951 ("40", not 40); `queue-id` and
    `dscp` are uint8 and must be numbers.
  - A term may carry `dscp` or `dscp-set`, never both; the default class's term lists every DSCP no
    other class claims, so all 64 are classified.
  - IPv4 and IPv6 need separate classifiers (type IPV4 / IPV6); both are rendered.
"""

from geryon.netconf.qos_profile import ACK_APPROX, ACK_SHARE_PERCENT, QosProfile, TargetLimits
import json

from geryon.errors import ConfigError
from geryon.netconf.render import QueueCount, Rendering, by_queue, counter, dscp_queues, dump_json

LIMITS = TargetLimits("openconfig", max_strict=8, ack_match=ACK_APPROX, control_queue=7,
                      control_why="queue-id 7 is geryon-control, network control (CS6/CS7) served first",
                      lossless_refused="openconfig-qos has no PFC (priority flow control) leaves; configure PFC "
                                       "with the vendor's own model and render the class lossy",
                      ack_why="openconfig-packet-match has no length range and no 'flag clear' test: one term per "
                              "pure-ACK length with ACK required (other flags unchecked), and terms have no order, "
                              "so a device may apply a DSCP term first")
DEFAULT_PORTS = ("eth0",)
POLICY = "geryon-sched"
ACK_QUEUE = "geryon-ack"
CONTROL_QUEUE = "geryon-control"
TCP_OPTION_LENGTHS = (0, 12, 20, 24, 28, 32, 36, 40)  # none, TS, SACK x1-4, TS + SACK x1-3 (padded)
ACK_LENGTHS = {"IPV4": tuple(40 + n for n in TCP_OPTION_LENGTHS), "IPV6": tuple(20 + n for n in TCP_OPTION_LENGTHS)}


def _classifier(profile: QosProfile, family: str) -> dict:
    name = f"geryon-{family.lower()}"
    key = family.lower()
    terms = _ack_terms(profile, family)
    queues = by_queue(dscp_queues(profile, LIMITS.control_queue))
    for term, queue in [(CONTROL_QUEUE, LIMITS.control_queue)] + [(cls.name, cls.queue) for cls in profile.classes]:
        group = f"fg-{term}"
        if queues.get(queue):
            terms.append({"id": term, "config": {"id": term},
                          "conditions": {key: {"config": {"dscp-set": queues[queue]}}},
                          "actions": {"config": {"target-group": group}}})
    return {"name": name, "config": {"name": name, "type": family}, "terms": {"term": terms}}


def _ack_group(profile: QosProfile) -> str:
    return f"fg-{ACK_QUEUE}" if profile.ack_own else f"fg-{profile.classes[0].name}"


def _ack_terms(profile: QosProfile, family: str) -> list[dict]:
    """One term per pure-ACK length: TCP, that length, ACK set (see the module docstring)."""
    if profile.ack_priority == "off":
        return []
    key = family.lower()
    return [{"id": f"pure-ack-{length}", "config": {"id": f"pure-ack-{length}"},
             "conditions": {key: {"config": {"protocol": 6, "length": length}},
                            "transport": {"config": {"detail-mode": "EXPLICIT", "explicit-detail-match-mode": "ALL",
                                                     "explicit-tcp-flags": ["openconfig-packet-match-types:TCP_ACK"]}}},
             "actions": {"config": {"target-group": _ack_group(profile)}}}
            for length in ACK_LENGTHS[family]]


def _scheduler_policy(profile: QosProfile) -> dict:
    schedulers = [{"sequence": 0, "config": {"sequence": 0, "priority": "STRICT"},  # network control, first
                   "inputs": {"input": [{"id": CONTROL_QUEUE, "config": {"id": CONTROL_QUEUE, "input-type": "QUEUE",
                                                                         "queue": CONTROL_QUEUE}}]}}]
    if profile.ack_own:  # served before every class, capped at ACK_SHARE_PERCENT of the port
        sequence = len(schedulers)
        schedulers.append({"sequence": sequence, "config": {"sequence": sequence, "priority": "STRICT",
                                                            "type": "openconfig-qos-types:ONE_RATE_TWO_COLOR"},
                           "inputs": {"input": [{"id": ACK_QUEUE, "config": {"id": ACK_QUEUE, "input-type": "QUEUE",
                                                                             "queue": ACK_QUEUE}}]},
                           "one-rate-two-color": {"config": {"cir-pct": ACK_SHARE_PERCENT}}})
    for sequence, cls in enumerate(profile.strict_classes, start=len(schedulers)):
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
    names = [(c.name, c.queue) for c in profile.classes]
    if profile.ack_own:
        names.insert(0, (ACK_QUEUE, profile.ack_queue))
    names.insert(0, (CONTROL_QUEUE, LIMITS.control_queue))
    queues = [{"name": name, "config": {"name": name, "queue-id": queue}} for name, queue in names]
    groups = [{"name": f"fg-{name}", "config": {"name": f"fg-{name}", "output-queue": name}} for name, _ in names]
    interfaces = [{
        "interface-id": port, "config": {"interface-id": port},
        "input": {"classifiers": {"classifier": [
            {"type": family, "config": {"type": family, "name": f"geryon-{family.lower()}"}}
            for family in ("IPV4", "IPV6")]}},
        "output": {"scheduler-policy": {"config": {"name": POLICY}},
                   "queues": {"queue": [{"name": name, "config": {"name": name}} for name, _ in names]}},
    } for port in ports]
    return {"openconfig-qos:qos": {
        "queues": {"queue": queues},
        "forwarding-groups": {"forwarding-group": groups},
        "classifiers": {"classifier": [_classifier(profile, "IPV4"), _classifier(profile, "IPV6")]},
        "scheduler-policies": {"scheduler-policy": [_scheduler_policy(profile)]},
        "interfaces": {"interface": interfaces},
    }}


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    """gNMI Get paths of each port's output queues (their state holds the counters)."""
    return tuple(f"/qos/interfaces/interface[interface-id={port}]/output/queues"
                 for port in profile.ports or DEFAULT_PORTS)


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[str, QueueCount]]:
    """An RFC 7951 `openconfig-qos:qos` document (as a gNMI Get of /qos returns it with JSON_IETF encoding)
    -> {port: {queue: QueueCount}} from each output queue's state (counter64 leaves are JSON strings); a
    queue is keyed by its queue-id where the document's /qos/queues gives one, else by its name."""
    try:
        qos = json.loads(text)["openconfig-qos:qos"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError("not an RFC 7951 openconfig-qos:qos document: ask the gNMI Get for /qos with "
                          "encoding JSON_IETF") from None
    ids = {queue["name"]: queue.get("config", {}).get("queue-id", queue.get("state", {}).get("queue-id"))
           for queue in qos.get("queues", {}).get("queue", [])}
    out: dict[str, dict[int | str, QueueCount]] = {}
    for interface in qos.get("interfaces", {}).get("interface", []):
        queues = interface.get("output", {}).get("queues", {}).get("queue", [])
        out[interface["interface-id"]] = {
            _queue_key(queue["name"], ids.get(queue["name"])): QueueCount(
                counter(queue.get("state", {}).get("transmit-pkts")),
                counter(queue.get("state", {}).get("transmit-octets")),
                counter(queue.get("state", {}).get("dropped-pkts")))
            for queue in queues}
    return out


def _queue_key(name: str, queue_id) -> int | str:
    """A queue's number where the document gives its queue-id (as `geryon cluster check` looks queues up),
    else its name."""
    return int(queue_id) if queue_id is not None else name


def render(profile: QosProfile) -> Rendering:
    data = instance(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    return Rendering("openconfig", profile, dump_json(data), data, notes, verify=verify_commands(profile))
