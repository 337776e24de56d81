"""Cisco NX-OS: the profile as type-qos classification and a type-queuing egress policy.

Follows the Cisco Nexus 9000 Series NX-OS Quality of Service Configuration Guide (chapters
"Configuring Classification" — `class-map type qos`, `match dscp`, `set qos-group`; "Configuring
Queuing and Scheduling" — `policy-map type queuing`, the system classes `c-out-8q-q1`..`c-out-8q-q7` and
`c-out-8q-q-default`, `priority level 1`, `bandwidth remaining percent`; `system qos`).

  class-map type qos match-any GERYON-<class>: match dscp <list>
  policy-map type qos GERYON-IN: per class `set qos-group <queue>` (class-default -> the default class)
  policy-map type queuing GERYON-OUT: every one of the 8 output classes, strict ones `priority level 1`,
      the others `bandwidth remaining percent P` with P summing to exactly 100 (unused queues get 0)
  system qos: service-policy type queuing output GERYON-OUT; per port: service-policy type qos input

Pure ACKs (`ack_priority`), following the Nexus 9000 Security Configuration Guide ("Configuring IP ACLs":
`ip access-list`, `permit tcp ... ack`, `packet-length lt N`) and the QoS guide ("match access-group name"
in a `class-map type qos`; classes of a policy are matched in the order listed), as also modelled by
https://netascode.cisco.com/docs/data_models/nxos/device/ip_access_list (TCP flags, packet length operators):
  ip access-list GERYON-ACK: `10 permit tcp any any ack packet-length lt 128`; class-map type qos
  GERYON-PURE-ACK matching it, listed first in GERYON-IN with `set qos-group <top class's queue>`.
  "top" only: one strict queue (`priority level 1`) is rendered, so "own" is refused. Approximate: `ack`
  checks that ACK is set, not that the other flags are clear; IPv4 only. Not run on a device.

Hazards:
  - `bandwidth remaining percent` over the non-priority classes of a queuing policy must sum to 100:
    weights are turned into whole percentages by largest remainder, and a weight below 1% is refused.
  - One strict queue (`priority level 1`) is rendered: multi-level priority is platform-specific.
  - qos-group 0 is `c-out-8q-q-default`, the queue of everything unclassified, so the default class must
    be weighted (a strict catch-all would starve the other weighted classes).
  - The classification policy is per ingress port; the queuing policy is system-wide.
"""

from geryon.netconf.qos_profile import ACK_APPROX, ACK_MAX_LEN, QosProfile, TargetLimits, percentages
from geryon.netconf.render import Rendering

LIMITS = TargetLimits("nxos", max_strict=1, percent_weights=True, needs_weighted_default=True,
                      ack_match=ACK_APPROX,
                      ack_why=f"the ACL matches 'ack' (ACK set, other flags not checked) and packet-length lt "
                              f"{ACK_MAX_LEN}, IPv4 only")
ACK_ACL = "GERYON-ACK"
ACK_CLASS = "GERYON-PURE-ACK"
DEFAULT_PORTS = ("Ethernet1/1",)
QOS_POLICY = "GERYON-IN"
QUEUING_POLICY = "GERYON-OUT"


def queuing_class(queue: int) -> str:
    return "c-out-8q-q-default" if queue == 0 else f"c-out-8q-q{queue}"


def commands(profile: QosProfile) -> list[str]:
    by_class: dict[str, list[int]] = {cls.name: list(cls.dscps) for cls in profile.classes}
    ack = profile.ack_priority != "off"
    lines = [f"ip access-list {ACK_ACL}", f"  10 permit tcp any any ack packet-length lt {ACK_MAX_LEN}",
             f"class-map type qos match-any {ACK_CLASS}", f"  match access-group name {ACK_ACL}"] if ack else []
    for cls in profile.classes:
        if by_class[cls.name] and cls.name != profile.default_class:
            lines += [f"class-map type qos match-any GERYON-{cls.name}",
                      f"  match dscp {','.join(map(str, sorted(by_class[cls.name])))}"]
    lines.append(f"policy-map type qos {QOS_POLICY}")
    if ack:  # first: a pure ACK of any DSCP goes to the top class's queue
        lines += [f"  class {ACK_CLASS}", f"    set qos-group {profile.ack_queue}"]
    for cls in profile.classes:
        if by_class[cls.name] and cls.name != profile.default_class:
            lines += [f"  class GERYON-{cls.name}", f"    set qos-group {cls.queue}"]
    default = profile.by_name(profile.default_class)
    lines += ["  class class-default", f"    set qos-group {default.queue}"]
    shares = dict(zip((c.queue for c in profile.weighted), percentages([c.weight for c in profile.weighted])))
    strict = {c.queue for c in profile.strict_classes}
    lines.append(f"policy-map type queuing {QUEUING_POLICY}")
    for queue in range(7, -1, -1):
        lines.append(f"  class type queuing {queuing_class(queue)}")
        lines.append("    priority level 1" if queue in strict
                     else f"    bandwidth remaining percent {shares.get(queue, 0)}")
    lines += ["system qos", f"  service-policy type queuing output {QUEUING_POLICY}"]
    for port in profile.ports or DEFAULT_PORTS:
        lines += [f"interface {port}", f"  service-policy type qos input {QOS_POLICY}"]
    return lines


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    head = [] if profile.ack_priority == "off" else [
        f"! geryon: pure ACKs -> qos-group {profile.ack_queue} (class {profile.classes[0].name!r}) via {ACK_CLASS}",
        f"! APPROXIMATE match: {LIMITS.ack_why}; small SYN-ACK/FIN/PSH segments match too"]
    return Rendering("nxos", profile, "\n".join(head + lines) + "\n", None, notes, tuple(lines))
