"""NVIDIA Cumulus Linux (NVUE): the profile as `nv set qos ...` commands on the default-global profiles.

Follows the Cumulus Linux User Guide, "Quality of Service" (5.x: "Trust and Marking" — `nv set qos
mapping default-global trust l3`, `... dscp <n> switch-priority <p>`; "Egress Queues" — `nv set qos
egress-queue-mapping default-global switch-priority <p> traffic-class <tc>`; "Egress Scheduling" —
`nv set qos egress-scheduler default-global traffic-class <tc> mode strict|dwrr`, `bw-percent <n>`)
and the NVUE command reference (QoS set commands).

Pure ACKs (`ack_priority`) are refused: NVUE ACL rules (NVUE command reference, "ACL":
https://docs.nvidia.com/networking-ethernet-software/nvue-reference/Set-and-Unset-Commands/ACL/,
`nv set acl <acl-id> rule <rule-id> match ip ...`) match the IP protocol and TCP flags but list no packet
length, and a flags-only match would also take every bulk data segment sent without PSH.

Safe on a production fabric:
  - Network control: geryon maps CS6 and CS7 (48, 56) to switch priority and traffic class 7, strict,
    above every class (a class on queue 7 moves to 6); no shaper is rendered. Not checked against the
    guide: the default DSCP map it replaces for 48/56, which traffic class the switch's own control
    traffic uses (older releases reserved internal CoS 3 for CPU-generated traffic), that among strict
    traffic classes the higher one is served first, and whether a shaper is recommended on strict ones.
  - Lossless: no traffic class is lossless by default (RoCE mode, `nv set qos roce`, is off), so none is
    reserved; lossless classes are refused, because `nv set qos roce` rewrites the switch-wide buffer,
    PFC and ECN profiles (User Guide, "RDMA over Converged Ethernet"), which geryon does not own.
  - Only the default-global mapping, egress-queue-mapping and egress-scheduler entries geryon sets are
    touched; no `nv unset` is issued; `nv config apply <revision>` returns to the revision before.
  - `trust l3` classifies by the DSCP of IPv4 and IPv6 packets alike (not checked against the guide).
  - Verification: `nv show interface <port> counters qos egress-queue-stats -o json` (Cumulus Linux 5.5 and
    later; `nv show interface <port> qos counters egress-queue-stats` before), listed at the end as comments
    and in `verify`, parsed by `parse_queue_counters`. The NVUE Command Reference ("Show Commands", QoS)
    documents the columns of its table form: traffic-class, tx-frames, tx-bytes, tx-uc-buffer-discards,
    wred-discards; the JSON form is an object keyed by traffic class with those names as fields, as
    NVIDIA's own switch tests read it (`output[traffic_class]["tx-frames"]`). The output does not name
    the port: the parser is told it. Drops are tx-uc-buffer-discards plus wred-discards.

Hazards:
  - The default egress scheduler gives every traffic class 0-7 DWRR with bw-percent 12 or 13
    ("12,13,12,13,..."): classes left untouched keep that share and the DWRR sum would exceed 100. So
    every traffic class is rendered: ours get their percentage, unused ones 1% each, and the DWRR
    bw-percent values sum to exactly 100 (each 1..100).
  - The default mapping trusts 802.1p (`trust l2`) on some releases: `trust l3` is set explicitly.
  - Changes are staged until `nv config apply`; `nv config history` / `nv config apply <revision>` is
    the rollback (see geryon.netconf.session).
"""

from geryon.errors import ConfigError, TargetLimitError
from geryon.netconf.qos_profile import QosProfile, TargetLimits, percentages
from geryon.netconf.render import QueueCount, Rendering, counter, counter_sum, dscp_queues, load_json

LIMITS = TargetLimits("nvue", max_strict=8, percent_weights=True, ack_match=None, control_queue=7,
                      control_why="traffic class 7 carries network control (CS6/CS7), strict above every class",
                      lossless_refused="lossless RoCE on Cumulus Linux is `nv set qos roce`, which rewrites the "
                                       "switch-wide buffer, PFC and ECN profiles; enable it by hand and render the "
                                       "class lossy",
                      ack_why="NVUE ACL rules match TCP flags but have no packet-length match, so they would also "
                              "move every bulk data segment sent without PSH into the ACK queue")
NUM_TCS = 8


def dwrr_percentages(profile: QosProfile) -> dict[int, int]:
    """bw-percent per DWRR traffic class: ours by weight, unused classes 1 each; sums to 100."""
    used = {cls.queue for cls in profile.classes} | {LIMITS.control_queue}
    unused = [tc for tc in range(NUM_TCS) if tc not in used]
    weighted = profile.weighted
    if not weighted:
        return {tc: 0 for tc in unused} if not unused else dict(zip(unused, percentages([1] * len(unused))))
    budget = 100 - len(unused)
    if budget < len(weighted):
        raise TargetLimitError("nvue: not enough bw-percent left for the weighted classes")
    scaled = percentages([cls.weight for cls in weighted], "nvue", weighted)
    shares = _rescale(scaled, budget)
    out = {cls.queue: share for cls, share in zip(weighted, shares)}
    out.update({tc: 1 for tc in unused})
    return out


def _rescale(shares: list[int], budget: int) -> list[int]:
    exact = [s * budget / 100 for s in shares]
    out = [max(1, int(x)) for x in exact]
    order = sorted(range(len(out)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    i = 0
    while sum(out) < budget:
        out[order[i % len(order)]] += 1
        i += 1
    while sum(out) > budget:
        j = max(range(len(out)), key=lambda k: out[k])
        out[j] -= 1
    return out


def commands(profile: QosProfile) -> list[str]:
    lines = ["nv set qos mapping default-global trust l3"]
    for dscp, queue in sorted(dscp_queues(profile, LIMITS.control_queue).items()):
        lines.append(f"nv set qos mapping default-global dscp {dscp} switch-priority {queue}")
    for queue in sorted({cls.queue for cls in profile.classes} | {LIMITS.control_queue}, reverse=True):
        lines.append(f"nv set qos egress-queue-mapping default-global switch-priority {queue} traffic-class {queue}")
    strict = {cls.queue for cls in profile.strict_classes} | {LIMITS.control_queue}
    shares = dwrr_percentages(profile)
    for tc in range(NUM_TCS - 1, -1, -1):
        base = f"nv set qos egress-scheduler default-global traffic-class {tc}"
        if tc in strict:
            lines.append(f"{base} mode strict")
        else:
            lines += [f"{base} mode dwrr", f"{base} bw-percent {shares[tc]}"]
    return lines


def verify_commands(profile: QosProfile) -> tuple[str, ...]:
    return tuple(f"nv show interface {port} counters qos egress-queue-stats -o json"
                 for port in profile.ports or ("swp1",))


def parse_queue_counters(text: str, port: str | None = None) -> dict[str, dict[int, QueueCount]]:
    """`nv show interface PORT counters qos egress-queue-stats -o json` ({"<tc>": {"tx-frames", "tx-bytes",
    "tx-uc-buffer-discards", "wred-discards"}}) -> {port: {traffic class: QueueCount}}."""
    if port is None:
        raise ConfigError("the NVUE egress-queue-stats output does not name its port: pass the port the command "
                          "was run for")
    data = load_json(text, f"nv show interface {port} counters qos egress-queue-stats -o json")
    return {port: {int(tc): QueueCount(counter(stats.get("tx-frames")), counter(stats.get("tx-bytes")),
                                       counter_sum((stats.get("tx-uc-buffer-discards"), stats.get("wred-discards"))))
                   for tc, stats in (data.items() if isinstance(data, dict) else ())
                   if str(tc).isdigit() and isinstance(stats, dict)}}


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + ("default-global profiles apply to every port; --ports is not used",) \
        if profile.ports else profile.notes
    verify = verify_commands(profile)
    tail = ["# geryon: per-queue counters:"] + [f"#   {command}" for command in verify]
    return Rendering("nvue", profile, "\n".join(lines + tail) + "\n", None, notes, tuple(lines), verify)
