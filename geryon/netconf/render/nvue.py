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

Hazards:
  - The default egress scheduler gives every traffic class 0-7 DWRR with bw-percent 12 or 13
    ("12,13,12,13,..."): classes left untouched keep that share and the DWRR sum would exceed 100. So
    every traffic class is rendered: ours get their percentage, unused ones 1% each, and the DWRR
    bw-percent values sum to exactly 100 (each 1..100).
  - The default mapping trusts 802.1p (`trust l2`) on some releases: `trust l3` is set explicitly.
  - Changes are staged until `nv config apply`; `nv config history` / `nv config apply <revision>` is
    the rollback (see geryon.netconf.session).
"""

from geryon.errors import TargetLimitError
from geryon.netconf.qos_profile import QosProfile, TargetLimits, percentages
from geryon.netconf.render import Rendering

LIMITS = TargetLimits("nvue", max_strict=8, percent_weights=True, ack_match=None,
                      ack_why="NVUE ACL rules match TCP flags but have no packet-length match, so they would also "
                              "move every bulk data segment sent without PSH into the ACK queue")
NUM_TCS = 8


def dwrr_percentages(profile: QosProfile) -> dict[int, int]:
    """bw-percent per DWRR traffic class: ours by weight, unused classes 1 each; sums to 100."""
    used = {cls.queue for cls in profile.classes}
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
    for dscp, cls in sorted(profile.dscp_map().items()):
        lines.append(f"nv set qos mapping default-global dscp {dscp} switch-priority {cls.queue}")
    for cls in sorted(profile.classes, key=lambda c: -c.queue):
        lines.append(f"nv set qos egress-queue-mapping default-global switch-priority {cls.queue} "
                     f"traffic-class {cls.queue}")
    strict = {cls.queue for cls in profile.strict_classes}
    shares = dwrr_percentages(profile)
    for tc in range(NUM_TCS - 1, -1, -1):
        base = f"nv set qos egress-scheduler default-global traffic-class {tc}"
        if tc in strict:
            lines.append(f"{base} mode strict")
        else:
            lines += [f"{base} mode dwrr", f"{base} bw-percent {shares[tc]}"]
    return lines


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + ("default-global profiles apply to every port; --ports is not used",) \
        if profile.ports else profile.notes
    return Rendering("nvue", profile, "\n".join(lines) + "\n", None, notes, tuple(lines))
