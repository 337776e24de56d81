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

Hazards:
  - Only one queue may be `strict-high` (a second strict-high scheduler is rejected, or starves the
    first on some platforms): a profile with more than one strict class is refused.
  - On QFX queue 7 belongs to the default `network-control` forwarding class, so a class on queue 7
    moves to 6 (on every platform, so one rendering fits all); if 6 is taken the profile is refused.
  - Code points are 6-bit binary strings (EF = 101110); every DSCP is classified, the unlisted ones
    into the default class, so nothing falls back to the platform's default classifier.
  - transmit-rate percentages of the weighted schedulers sum to 100.
"""

from geryon.netconf.qos_profile import ACK_APPROX, ACK_MAX_LEN, QosProfile, TargetLimits, percentages
from geryon.netconf.render import Rendering

LIMITS = TargetLimits("junos", max_strict=1, reserved_queues=(7,), percent_weights=True,
                      reserved_why="queue 7 is the network-control forwarding class on QFX",
                      ack_match=ACK_APPROX,
                      ack_why="the firewall filter matches exactly the AckFilterOp fields, but for IPv4 only "
                              "(family inet); IPv6 pure ACKs keep their DSCP class")
ACK_FILTER = "GERYON-ACK"
ACK_FLAGS = '"ack & !syn & !fin & !rst & !push & !urgent"'

DEFAULT_PORTS = ("xe-0/0/0",)
CLASSIFIER = "GERYON-DSCP"
SCHEDULER_MAP = "GERYON-MAP"


def forwarding_class(cls) -> str:
    return f"geryon-{cls.name}"


def commands(profile: QosProfile) -> list[str]:
    cos = "set class-of-service"
    lines = [f"{cos} forwarding-classes class {forwarding_class(c)} queue-num {c.queue}" for c in profile.classes]
    by_class: dict[str, list[int]] = {cls.name: [] for cls in profile.classes}
    for dscp, cls in sorted(profile.dscp_map().items()):
        by_class[cls.name].append(dscp)
    for cls in profile.classes:
        if by_class[cls.name]:
            points = " ".join(f"{d:06b}" for d in by_class[cls.name])
            lines.append(f"{cos} classifiers dscp {CLASSIFIER} forwarding-class {forwarding_class(cls)} "
                         f"loss-priority low code-points [ {points} ]")
    shares = dict(zip((c.name for c in profile.weighted), percentages([c.weight for c in profile.weighted])))
    for cls in profile.classes:
        scheduler = f"{forwarding_class(cls)}-sched"
        if cls.strict:
            lines.append(f"{cos} schedulers {scheduler} priority strict-high")
        else:
            lines += [f"{cos} schedulers {scheduler} transmit-rate percent {shares[cls.name]}",
                      f"{cos} schedulers {scheduler} priority low"]
        lines.append(f"{cos} scheduler-maps {SCHEDULER_MAP} forwarding-class {forwarding_class(cls)} "
                     f"scheduler {scheduler}")
    for port in profile.ports or DEFAULT_PORTS:
        lines += [f"{cos} interfaces {port} scheduler-map {SCHEDULER_MAP}",
                  f"{cos} interfaces {port} unit 0 classifiers dscp {CLASSIFIER}"]
    if profile.ack_priority != "off":
        lines += ack_filter(profile)
    return lines


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
    return Rendering("junos", profile, "\n".join(comments(profile) + lines) + "\n", None, notes, tuple(lines))
