"""Juniper Junos: the profile as `set class-of-service ...` statements.

Follows the Junos OS Class of Service User Guide (and, for QFX, "Traffic Management User Guide for QFX
Series"): `forwarding-classes class <fc> queue-num <n>`, `classifiers dscp <name> forwarding-class <fc>
loss-priority low code-points [ <6-bit patterns> ]`, `schedulers <s> priority strict-high` or
`transmit-rate percent <p>`, `scheduler-maps <map> forwarding-class <fc> scheduler <s>`, and per
interface `scheduler-map` and `unit 0 classifiers dscp`.

Pure ACKs (`ack_priority`), following the Junos "Firewall Filter Match Conditions for IPv4 Traffic"
(`tcp-flags` with bit names fin syn rst push ack urgent and the operators & | !, `protocol tcp`,
`packet-length`) and "Multifield Classifier" (`then forwarding-class`, `then loss-priority`) pages, as
found: the Junos 10.3 "Configuring Protocol-Independent Match Conditions" page (`packet-length bytes`: the IP
packet, header included; www.juniper.net/techpubs/en_US/junos10.3/topics/task/configuration/
firewall-filter-match-conditions-protocol-independent-configuring.html) and the ACX/EX match-condition
tables of the Junos firewall filter guide (`tcp-flags` bit names and operators):
  firewall family inet filter GERYON-ACK: term pure-ack `protocol tcp`, `tcp-flags "ack & !syn & !fin &
  !rst & !push & !urgent"`, `packet-length 0-127` -> forwarding class of the top class; term rest accepts
  everything else (its BA classification stands); applied as `family inet filter input` on unit 0.
  "top" only: Junos takes one strict-high queue (LIMITS), so "own" is refused. IPv4 only (IPv6 pure ACKs
  keep their DSCP class), said as a warning. Not run on a device; `packet-length` in filters differs by
  platform (check the QFX/EX match-condition tables).

Safe on a production fabric (Junos "Traffic Management User Guide for QFX Series": "Defining CoS
Forwarding Classes", "Understanding Default CoS Settings", "Defining CoS Queue Scheduling Priority",
"dscp-ipv6"):
  - Network control: queue 7 is the default `network-control` forwarding class. CS6 and CS7 (110000,
    111000) are classified into it and GERYON-MAP gives it a scheduler (`transmit-rate percent`
    CONTROL_SHARE_PERCENT), so a class on queue 7 moves to 6 (refused if 6 is taken). QFX5xxx takes one
    strict-high queue, so control cannot sit above a strict class; the guide "recommend[s] that you always
    apply a shaping rate to strict-high priority queues to prevent them from starving other queues", so
    the strict class gets `shaping-rate percent` STRICT_GUARD_PERCENT, and the weighted classes'
    transmit rates sum to 100 less the control share.
  - Lossless: the default `fcoe` (queue 3) and `no-loss` (queue 4) forwarding classes are lossless; a
    lossy class there is refused. A `lossless = true` class becomes a forwarding class with `no-loss`
    (`queue-num N no-loss`, up to six lossless classes); the port's PFC (congestion-notification-profile)
    is the fabric's and is not rendered.
  - IPv4 and IPv6: `classifiers dscp` classifies IPv4; a `classifiers dscp-ipv6` with the same code
    points is rendered and bound on unit 0 too. (ACX routers refuse both on one interface: there a DSCP
    classifier alone classifies both families; drop the dscp-ipv6 lines.)
  - Only statements geryon owns are set (its forwarding classes, classifiers, schedulers, scheduler map,
    the listed interfaces); nothing is deleted. `commit confirmed` / `rollback 1` undo exactly that commit.
  - Verification: `show interfaces queue <port> | display json`, listed at the end as comments and in
    `verify`, parsed by `parse_queue_counters`. The JSON is Junos's mapping of the XML reply ("Map Junos
    OS Command Output to JSON in the CLI", Junos XML Management Protocols guide: every element a list of
    objects, a leaf's text under "data"); the elements are those of the get-interface-queue-information
    reply (interface-information / physical-interface (name) / queue-counters / queue (queue-number,
    queue-counters-trans-packets, queue-counters-trans-bytes, queue-counters-total-drop-packets), as
    the open-source czerwonk/junos_exporter reads them, pkg/features/interfacequeue/rpc.go).

Hazards:
  - Only one queue may be `strict-high` (a second strict-high scheduler is rejected, or starves the
    first on some platforms): a profile with more than one strict class is refused.
  - Code points are 6-bit binary strings (EF = 101110); every DSCP is classified, the unlisted ones
    into the default class, so nothing falls back to the platform's default classifier.
  - transmit-rate percentages of the weighted schedulers sum to 100.
"""

from geryon.netconf.qos_profile import (ACK_APPROX, ACK_MAX_LEN, CONTROL_SHARE_PERCENT, PLATFORM_LOSSLESS_QUEUES,
                                    STRICT_GUARD_PERCENT, QosProfile, TargetLimits, percentages)
from geryon.netconf.render import QueueCount, Rendering, by_queue, counter, dscp_queues, load_json

LIMITS = TargetLimits("junos", max_strict=1, percent_weights=True, control_queue=7,
                      control_why="queue 7 is the network-control forwarding class (CS6/CS7) on QFX",
                      lossless_queues=PLATFORM_LOSSLESS_QUEUES,
                      lossless_why="the default fcoe (queue 3) and no-loss (queue 4) forwarding classes",
                      ack_match=ACK_APPROX,
                      ack_why="the firewall filter matches exactly the AckFilterOp fields, but for IPv4 only "
                              "(family inet); IPv6 pure ACKs keep their DSCP class")
ACK_FILTER = "GERYON-ACK"
ACK_FLAGS = '"ack & !syn & !fin & !rst & !push & !urgent"'

DEFAULT_PORTS = ("xe-0/0/0",)
CLASSIFIER = "GERYON-DSCP"
CLASSIFIER6 = "GERYON-DSCP6"
SCHEDULER_MAP = "GERYON-MAP"
CONTROL_CLASS = "network-control"  # the QFX default forwarding class of queue 7


def forwarding_class(cls) -> str:
    return f"geryon-{cls.name}"


def commands(profile: QosProfile) -> list[str]:
    cos = "set class-of-service"
    lines = [f"{cos} forwarding-classes class {forwarding_class(c)} queue-num {c.queue}"
             + (" no-loss" if c.lossless else "") for c in profile.classes]
    queues = by_queue(dscp_queues(profile, LIMITS.control_queue))
    names = [(forwarding_class(cls), cls.queue) for cls in profile.classes] + [(CONTROL_CLASS, LIMITS.control_queue)]
    for kind, classifier in (("dscp", CLASSIFIER), ("dscp-ipv6", CLASSIFIER6)):
        for name, queue in names:
            if queues.get(queue):
                points = " ".join(f"{d:06b}" for d in queues[queue])
                lines.append(f"{cos} classifiers {kind} {classifier} forwarding-class {name} "
                             f"loss-priority low code-points [ {points} ]")
    weighted = [c.weight for c in profile.weighted]
    shares = dict(zip((c.name for c in profile.weighted), _rescale(percentages(weighted), 100 - CONTROL_SHARE_PERCENT)
                      if weighted else []))
    for cls in profile.classes:
        scheduler = f"{forwarding_class(cls)}-sched"
        if cls.strict:
            lines += [f"{cos} schedulers {scheduler} priority strict-high",
                      f"{cos} schedulers {scheduler} shaping-rate percent {STRICT_GUARD_PERCENT}"]
        else:
            lines += [f"{cos} schedulers {scheduler} transmit-rate percent {shares[cls.name]}",
                      f"{cos} schedulers {scheduler} priority low"]
        lines.append(f"{cos} scheduler-maps {SCHEDULER_MAP} forwarding-class {forwarding_class(cls)} "
                     f"scheduler {scheduler}")
    control = "geryon-control-sched"
    lines += [f"{cos} schedulers {control} transmit-rate percent {CONTROL_SHARE_PERCENT}",
              f"{cos} schedulers {control} priority low",
              f"{cos} scheduler-maps {SCHEDULER_MAP} forwarding-class {CONTROL_CLASS} scheduler {control}"]
    for port in profile.ports or DEFAULT_PORTS:
        lines += [f"{cos} interfaces {port} scheduler-map {SCHEDULER_MAP}",
                  f"{cos} interfaces {port} unit 0 classifiers dscp {CLASSIFIER}",
                  f"{cos} interfaces {port} unit 0 classifiers dscp-ipv6 {CLASSIFIER6}"]
    if profile.ack_priority != "off":
        lines += ack_filter(profile)
    return lines


def _rescale(shares: list[int], budget: int) -> list[int]:
    """Whole percentages summing to 100 rescaled to sum to `budget`, each at least 1 (largest remainder)."""
    exact = [s * budget / 100 for s in shares]
    out = [max(1, int(x)) for x in exact]
    order = sorted(range(len(out)), key=lambda k: exact[k] - int(exact[k]), reverse=True)
    for i in order[:max(0, budget - sum(out))]:
        out[i] += 1
    while sum(out) > budget:
        out[out.index(max(out))] -= 1
    return out


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    return tuple(f"show interfaces queue {port} | display json" for port in profile.ports or DEFAULT_PORTS)


def _leaf(element: dict, name: str) -> str | None:
    """The text of a leaf in Junos JSON ({"name": [{"data": "text"}]}), stripped; None where absent."""
    values = element.get(name) or [{}]
    data = values[0].get("data") if isinstance(values[0], dict) else None
    return data.strip() if isinstance(data, str) else data


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[int, QueueCount]]:
    """`show interfaces queue PORT | display json` -> {port: {queue number: QueueCount}} of transmitted packets
    and bytes and total drops (see the module docstring for the layout)."""
    data = load_json(text, "show interfaces queue PORT | display json")
    out: dict[str, dict[int, QueueCount]] = {}
    for information in (data.get("interface-information", []) if isinstance(data, dict) else []):
        for interface in information.get("physical-interface", []):
            queues = out.setdefault(_leaf(interface, "name") or "", {})
            for block in interface.get("queue-counters", []):
                for queue in block.get("queue", []):
                    number = _leaf(queue, "queue-number")
                    if number and number.isdigit():
                        queues[int(number)] = QueueCount(
                            counter(_leaf(queue, "queue-counters-trans-packets")),
                            counter(_leaf(queue, "queue-counters-trans-bytes")),
                            counter(_leaf(queue, "queue-counters-total-drop-packets")))
    return out


def ack_filter(profile: QosProfile) -> list[str]:
    """The multifield classifier sending pure ACKs to the top class's forwarding class ("top")."""
    term = f"set firewall family inet filter {ACK_FILTER} term"
    lines = [f"{term} pure-ack from protocol tcp", f"{term} pure-ack from tcp-flags {ACK_FLAGS}",
             f"{term} pure-ack from packet-length 0-{ACK_MAX_LEN - 1}",
             f"{term} pure-ack then forwarding-class {forwarding_class(profile.classes[0])}",
             f"{term} pure-ack then loss-priority low", f"{term} pure-ack then accept", f"{term} rest then accept"]
    return lines + [f"set interfaces {port} unit 0 family inet filter input {ACK_FILTER}"
                    for port in profile.ports or DEFAULT_PORTS]


def comments(profile: QosProfile) -> list[str]:
    if profile.ack_priority == "off":
        return []
    return [f"# geryon: pure ACKs -> forwarding class {forwarding_class(profile.classes[0])} (queue "
            f"{profile.ack_queue}) by firewall filter {ACK_FILTER}",
            f"# WARNING: {LIMITS.ack_why}"]


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    verify = verify_commands(profile)
    tail = ["# geryon: per-queue counters:"] + [f"#   {command}" for command in verify]
    return Rendering("junos", profile, "\n".join(comments(profile) + lines + tail) + "\n", None, notes,
                     tuple(lines), verify)
