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

Safe on a production fabric:
  - Network control: CS6 and CS7 (48, 56) are classified by class-map GERYON-control into qos-group 7,
    served `priority level 1`; a strict class moves from queue 7 to 6 and is served `priority level 2`
    (multi-level priority, "Configuring Queuing and Scheduling": `priority level 1..N` on the Cloud Scale
    platforms), so a saturated strict class cannot starve routing protocols. Not checked against the guide:
    the number of priority levels of a given Nexus model, and whether the switch's own control traffic
    also uses q7; no shaper is rendered on priority queues (the guide names none for this case).
  - Lossless: the Nexus 9000 default network-qos policy is all drop (no queue lossless by default, none
    reserved). Lossless classes are refused: PFC needs a system-wide `policy-map type network-qos` with
    `pause pfc-cos`, which replaces the switch's whole network-qos policy, not something geryon owns.
  - Only lines geryon owns: its ACL, class-maps and policy-maps (named GERYON-*), the `system qos`
    queuing binding and the listed interfaces; no `no`/`default` line is issued. The checkpoint rollback
    (`rollback running-config checkpoint`) returns to the saved running config.
  - `match dscp` in a `class-map type qos` matches the DSCP of IPv4 and IPv6 packets alike (not checked
    against the guide).
  - Verification: `show queuing interface <port> | json`, listed at the end as comments and in `verify`,
    parsed by `parse_queue_counters`. The layout is the command's NX-API schema in the Cisco Nexus 9000
    Series NX-OS Command Reference (Show Commands, 9.3(x)), "show queuing": TABLE_module / ROW_module /
    TABLE_queuing_interface (dir, if_name_str) / TABLE_qosgrp_egress_stats (eq-qosgrp) /
    TABLE_qosgrp_egress_stats_entry (eq-stat-type, eq-stat-units, eq-uc-stat-value, eq-mc-stat-value);
    the row labels "Tx"/"Dropped" and units "Pkts"/"Byts" are those of the text form ("Tx Pkts",
    "Dropped Byts") as public NX-API exporters read them (e.g. the nxapi_netbox scripts of Allen Robel,
    Cisco). Unicast values are read (probes are unicast); qos-group n is queue n (c-out-8q-q<n>); a
    TABLE with one row holds it as an object, not a list (NX-API's usual form), and both are read.

Hazards:
  - `bandwidth remaining percent` over the non-priority classes of a queuing policy must sum to 100:
    weights are turned into whole percentages by largest remainder, and a weight below 1% is refused.
  - One strict class is rendered (`priority level 2`, below network control's level 1).
  - qos-group 0 is `c-out-8q-q-default`, the queue of everything unclassified, so the default class must
    be weighted (a strict catch-all would starve the other weighted classes).
  - The classification policy is per ingress port; the queuing policy is system-wide.
"""

from geryon.netconf.qos_profile import ACK_APPROX, ACK_MAX_LEN, CONTROL_DSCPS, QosProfile, TargetLimits, percentages
from geryon.netconf.render import QueueCount, Rendering, counter, load_json

LIMITS = TargetLimits("nxos", max_strict=1, percent_weights=True, needs_weighted_default=True, control_queue=7,
                      control_why="qos-group 7 carries network control (CS6/CS7), priority level 1 above every "
                                  "class",
                      lossless_refused="PFC on NX-OS needs a system-wide network-qos policy (pause pfc-cos) that "
                                       "replaces the switch's own; configure it by hand and render the class lossy",
                      ack_match=ACK_APPROX,
                      ack_why=f"the ACL matches 'ack' (ACK set, other flags not checked) and packet-length lt "
                              f"{ACK_MAX_LEN}, IPv4 only")
ACK_ACL = "GERYON-ACK"
ACK_CLASS = "GERYON-PURE-ACK"
DEFAULT_PORTS = ("Ethernet1/1",)
QOS_POLICY = "GERYON-IN"
QUEUING_POLICY = "GERYON-OUT"
CONTROL_CLASS = "GERYON-control"


def queuing_class(queue: int) -> str:
    return "c-out-8q-q-default" if queue == 0 else f"c-out-8q-q{queue}"


def commands(profile: QosProfile) -> list[str]:
    by_class: dict[str, list[int]] = {cls.name: list(cls.dscps) for cls in profile.classes}
    ack = profile.ack_priority != "off"
    lines = [f"ip access-list {ACK_ACL}", f"  10 permit tcp any any ack packet-length lt {ACK_MAX_LEN}",
             f"class-map type qos match-any {ACK_CLASS}", f"  match access-group name {ACK_ACL}"] if ack else []
    lines += [f"class-map type qos match-any {CONTROL_CLASS}", f"  match dscp {','.join(map(str, CONTROL_DSCPS))}"]
    for cls in profile.classes:
        if by_class[cls.name] and cls.name != profile.default_class:
            lines += [f"class-map type qos match-any GERYON-{cls.name}",
                      f"  match dscp {','.join(map(str, sorted(by_class[cls.name])))}"]
    lines.append(f"policy-map type qos {QOS_POLICY}")
    lines += [f"  class {CONTROL_CLASS}", f"    set qos-group {LIMITS.control_queue}"]
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
        if queue == LIMITS.control_queue:
            lines.append("    priority level 1")
        elif queue in strict:
            lines.append("    priority level 2")
        else:
            lines.append(f"    bandwidth remaining percent {shares.get(queue, 0)}")
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
    verify = verify_commands(profile)
    tail = ["! geryon: per-queue counters:"] + [f"!   {command}" for command in verify]
    return Rendering("nxos", profile, "\n".join(head + lines + tail) + "\n", None, notes, tuple(lines), verify)


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    return tuple(f"show queuing interface {port} | json" for port in profile.ports or DEFAULT_PORTS)


def _rows(table: dict, name: str) -> list[dict]:
    """The rows of NX-API's TABLE_<name>/ROW_<name>: a list, or one object where there is a single row."""
    rows = table.get(f"TABLE_{name}", {}).get(f"ROW_{name}", [])
    return [rows] if isinstance(rows, dict) else list(rows)


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[int, QueueCount]]:
    """`show queuing interface PORT | json` (or its NX-API reply) -> {port: {qos-group n: QueueCount}} of the
    egress unicast counters (see the module docstring for the layout)."""
    body = load_json(text, "show queuing interface PORT | json")
    if isinstance(body, dict) and "ins_api" in body:  # the NX-API envelope around the CLI's JSON
        body = body["ins_api"]["outputs"]["output"]["body"]
    out: dict[str, dict[int, QueueCount]] = {}
    for module in _rows(body if isinstance(body, dict) else {}, "module"):
        for interface in _rows(module, "queuing_interface"):
            if interface.get("dir", "Egress") != "Egress" or not str(interface.get("if_name_str", "")).split():
                continue
            queues = out.setdefault(str(interface["if_name_str"]).split()[0], {})
            for group in _rows(interface, "qosgrp_egress_stats"):
                if str(group.get("eq-qosgrp", "")).isdigit():
                    stats = {(row.get("eq-stat-type"), row.get("eq-stat-units")): counter(row.get("eq-uc-stat-value"))
                             for row in _rows(group, "qosgrp_egress_stats_entry")}
                    queues[int(group["eq-qosgrp"])] = QueueCount(stats.get(("Tx", "Pkts")), stats.get(("Tx", "Byts")),
                                                                 stats.get(("Dropped", "Pkts")))
    return out
