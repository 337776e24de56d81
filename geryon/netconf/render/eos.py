"""Arista EOS: the profile as EOS CLI — DSCP to traffic-class maps and a qos profile per port.

Follows the Arista EOS User Manual, chapter "Quality of Service" (sections "qos map dscp",
"qos map traffic-class to tx-queue", "qos profile", "qos trust", "tx-queue", "priority",
"bandwidth percent", "service-profile").

  qos map dscp <dscps> to traffic-class <tc>      up to 8 DSCPs per line (tc = the class's queue)
  qos map traffic-class <tc> to tx-queue <tc>
  qos profile GERYON: `qos trust dscp`, per class `tx-queue N` with `priority strict`, or
                      `no priority` + `bandwidth percent P` (percentages summing to 100)
  interface <port>: `service-profile GERYON`

Pure ACKs (`ack_priority`), following the EOS "Traffic Policies" chapter (`traffic-policies`,
`traffic-policy NAME`, `match NAME ipv4`, `protocol tcp flags ...`, `ip length ...`, `actions` /
`set traffic class N`, `traffic-policy input NAME` on the interface; the same layout as the arista_tp
generator of google/capirca, https://github.com/google/capirca/blob/master/doc/generators/arista_tp.md):
  traffic-policy GERYON-ACK: TCP with the ACK flag, IP length 20-127 -> traffic class = the ACK queue,
  applied on input of every port. "own": the ACK traffic class maps to its own tx-queue, strict (the EOS
  default) and shaped to ACK_SHARE_PERCENT (`shape rate P percent`).
  Approximate: `flags ack` checks that ACK is set, not that the others are clear, so small SYN-ACK, FIN
  and PSH segments (< 128 bytes) go there too; IPv4 only (IPv6 keeps its DSCP class). Not run on a device.

Safe on a production fabric:
  - Network control: on Sand-family platforms (Jericho/Qumran: 7280R, 7500R) tx-queue 7 is reserved for
    control-plane traffic, and EOS's default DSCP map puts CS7 (56-63) in traffic class 7. geryon maps CS6
    and CS7 (48, 56) to traffic class 7 on every EOS rendering, so routing protocols ride tx-queue 7, strict
    (the EOS default) and above every class; a class on queue 7 moves to 6, and if 6 is taken the profile
    is refused. No shaper is rendered on strict queues: none was found recommended for this case (not
    checked against the full manual).
  - Lossless: EOS ships with PFC off, so no queue is lossless by default and none is reserved. A
    `lossless = true` class gets, on each of the profile's ports, `priority-flow-control on` and
    `priority-flow-control priority <its traffic class> no-drop` (the syntax of published EOS RoCE
    configurations; the manual's "Priority Flow Control" section was not at hand, nor was it checked that
    the PFC priority equals the traffic class under `qos trust dscp`). ECN thresholds (`random-detect ecn`)
    are platform- and buffer-specific and are not rendered.
  - Only lines geryon owns: the DSCP and traffic-class maps it sets, the qos profile GERYON (the only
    place a `no` is issued: `no priority` on its own tx-queues) and the listed interfaces. The session
    (`configure session`, `commit timer`, `abort`) rolls back exactly those lines.
  - `qos map dscp` classifies IPv4 and IPv6 alike (the DSCP of either header; not checked against the
    manual).
  - Verification: `show interfaces <port> counters queue detail | json` (eAPI JSON), listed at the end as
    comments and in `verify`, parsed by `parse_queue_counters`. The layout follows Arista's ANTA test
    VerifyInterfacesEgressQueueDrops (arista-netdevops-community/anta, anta/tests/interfaces.py, which reads
    this command's JSON): egressQueueCounters / interfaces / <port> / ucastQueues / trafficClasses /
    TC<n> / dropPrecedences / DP<k> / droppedPackets. The enqueued counters of each drop precedence
    (enqueuedPackets, enqueuedBytes) carry the names EOS uses for the same counters in
    `show cpu counters queue | json`; ANTA does not read them, so they are not confirmed for this command:
    where a field is absent its count reads None and `geryon cluster check` reports the queue as not
    counted rather than passing it. Traffic class n is tx-queue n (the maps above).

Hazards:
  - EOS queues are strict by default, higher number first; `no priority` on tx-queue N makes N *and
    every queue below it* round-robin, which is why a profile's strict classes must sit above its
    weighted ones (validated for every profile).
  - Without `qos trust dscp` on the port the DSCP maps are not consulted (ports trust CoS by default
    on switched ports).
"""

from geryon.netconf.qos_profile import ACK_APPROX, ACK_MAX_LEN, ACK_SHARE_PERCENT, QosProfile, TargetLimits, percentages
from geryon.netconf.render import QueueCount, Rendering, by_queue, counter_sum, dscp_queues, load_json

PROFILE = "GERYON"
ACK_POLICY = "GERYON-ACK"
LIMITS = TargetLimits("eos", max_strict=8, percent_weights=True, control_queue=7,
                      control_why="tx-queue 7 is reserved for control traffic on Sand-family EOS platforms and "
                                  "carries CS6/CS7 on every EOS rendering",
                      ack_match=ACK_APPROX,
                      ack_why="the traffic-policy matches 'flags ack' (ACK set, other flags not checked) and IP "
                              f"length 20-{ACK_MAX_LEN - 1}, IPv4 only")
DEFAULT_PORTS = ("Ethernet1",)
MAP_CHUNK = 8


def commands(profile: QosProfile) -> list[str]:
    lines = []
    queues = by_queue(dscp_queues(profile, LIMITS.control_queue))
    for queue in [cls.queue for cls in profile.classes] + [LIMITS.control_queue]:
        dscps = queues.get(queue, [])
        for start in range(0, len(dscps), MAP_CHUNK):  # the map command takes a few values per line
            chunk = " ".join(map(str, dscps[start:start + MAP_CHUNK]))
            lines.append(f"qos map dscp {chunk} to traffic-class {queue}")
    for cls in profile.classes:
        lines.append(f"qos map traffic-class {cls.queue} to tx-queue {cls.queue}")
    if profile.ack_own:
        lines.append(f"qos map traffic-class {profile.ack_queue} to tx-queue {profile.ack_queue}")
    shares = dict(zip((c.name for c in profile.weighted), percentages([c.weight for c in profile.weighted])))
    lines += [f"qos profile {PROFILE}", "   qos trust dscp"]
    if profile.ack_own:
        lines += [f"   tx-queue {profile.ack_queue}", "      priority strict",
                  f"      shape rate {ACK_SHARE_PERCENT} percent"]
    for cls in profile.classes:
        lines.append(f"   tx-queue {cls.queue}")
        if cls.strict:
            lines.append("      priority strict")
        else:
            lines += ["      no priority", f"      bandwidth percent {shares[cls.name]}"]
    if profile.ack_priority != "off":
        lines += ack_policy(profile.ack_queue)
    lossless = [cls for cls in profile.classes if cls.lossless]
    for port in profile.ports or DEFAULT_PORTS:
        lines += [f"interface {port}", f"   service-profile {PROFILE}"]
        if profile.ack_priority != "off":
            lines.append(f"   traffic-policy input {ACK_POLICY}")
        if lossless:
            lines += ["   priority-flow-control on"] + [f"   priority-flow-control priority {cls.queue} no-drop"
                                                         for cls in lossless]
    return lines


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    return tuple(f"show interfaces {port} counters queue detail | json" for port in profile.ports or DEFAULT_PORTS)


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[int, QueueCount]]:
    """`show interfaces PORT counters queue detail | json` -> {port: {traffic class n: QueueCount}} of the unicast
    queues, each counter summed over the drop precedences (see the module docstring for the layout)."""
    data = load_json(text, "show interfaces PORT counters queue detail | json")
    interfaces = data.get("egressQueueCounters", {}).get("interfaces", {}) if isinstance(data, dict) else {}
    out: dict[str, dict[int, QueueCount]] = {}
    for name, queues in interfaces.items():
        classes = queues.get("ucastQueues", {}).get("trafficClasses", {})
        out[name] = {int(tc[2:]): _queue_count(detail) for tc, detail in classes.items()
                     if tc.startswith("TC") and tc[2:].isdigit()}
    return out


def _queue_count(detail: dict) -> QueueCount:
    precedences = list(detail.get("dropPrecedences", {}).values()) or [detail]
    return QueueCount(*(counter_sum(dp.get(key) for dp in precedences)
                        for key in ("enqueuedPackets", "enqueuedBytes", "droppedPackets")))


def ack_policy(queue: int) -> list[str]:
    """The traffic-policy that sends pure ACKs (approximately: see the module docstring) to traffic class `queue`."""
    return ["traffic-policies", f"   traffic-policy {ACK_POLICY}", "      match geryon-pure-ack ipv4",
            "         protocol tcp flags ack", f"         ip length 20-{ACK_MAX_LEN - 1}", "         actions",
            f"            set traffic class {queue}", "         !", "      !", "   !"]


def comments(profile: QosProfile) -> list[str]:
    if profile.ack_priority == "off":
        return []
    where = (f"their own strict tx-queue {profile.ack_queue}, shaped to {ACK_SHARE_PERCENT}%" if profile.ack_own
             else f"tx-queue {profile.ack_queue} of class {profile.classes[0].name!r}")
    return [f"! geryon: pure ACKs -> {where}",
            f"! APPROXIMATE match: {LIMITS.ack_why}; small SYN-ACK/FIN/PSH segments match too"]


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    verify = verify_commands(profile)
    tail = ["! geryon: per-queue counters:"] + [f"!   {command}" for command in verify]
    return Rendering("eos", profile, "\n".join(comments(profile) + lines + tail) + "\n", None, notes, tuple(lines),
                     verify)
