"""Arista EOS: the profile as EOS CLI — DSCP to traffic-class maps and a qos profile per port.

Follows the Arista EOS User Manual, chapter "Quality of Service" (sections "qos map dscp",
"qos map traffic-class to tx-queue", "qos profile", "qos trust", "tx-queue", "priority",
"bandwidth percent", "service-profile").

  qos map dscp <dscps> to traffic-class <tc>      up to 8 DSCPs per line (tc = the class's queue)
  qos map traffic-class <tc> to tx-queue <tc>
  qos profile GERYON: `qos trust dscp`, per class `tx-queue N` with `priority strict`, or
                      `no priority` + `bandwidth percent P` (percentages summing to 100)
  interface <port>: `service-profile GERYON`

Hazards:
  - On Sand-family platforms (Jericho/Qumran: 7280R, 7500R) tx-queue 7 is reserved for control-plane
    traffic, so a class on queue 7 moves to 6 (on every EOS platform, so one rendering fits all);
    if queue 6 is taken the profile is refused.
  - EOS queues are strict by default, higher number first; `no priority` on tx-queue N makes N *and
    every queue below it* round-robin, which is why a profile's strict classes must sit above its
    weighted ones (validated for every profile).
  - Without `qos trust dscp` on the port the DSCP maps are not consulted (ports trust CoS by default
    on switched ports).
"""

from geryon.netconf.profile import QosProfile, TargetLimits, percentages
from geryon.netconf.render import Rendering

PROFILE = "GERYON"
LIMITS = TargetLimits("eos", max_strict=8, reserved_queues=(7,), percent_weights=True,
                      reserved_why="tx-queue 7 is reserved for control traffic on Sand-family EOS platforms")
DEFAULT_PORTS = ("Ethernet1",)
MAP_CHUNK = 8


def commands(profile: QosProfile) -> list[str]:
    lines = []
    by_class: dict[str, list[int]] = {cls.name: [] for cls in profile.classes}
    for dscp, cls in sorted(profile.dscp_map().items()):
        by_class[cls.name].append(dscp)
    for cls in profile.classes:
        dscps = by_class[cls.name]
        for start in range(0, len(dscps), MAP_CHUNK):  # the map command takes a few values per line
            chunk = " ".join(map(str, dscps[start:start + MAP_CHUNK]))
            lines.append(f"qos map dscp {chunk} to traffic-class {cls.queue}")
    for cls in profile.classes:
        lines.append(f"qos map traffic-class {cls.queue} to tx-queue {cls.queue}")
    shares = dict(zip((c.name for c in profile.weighted), percentages([c.weight for c in profile.weighted])))
    lines += [f"qos profile {PROFILE}", "   qos trust dscp"]
    for cls in profile.classes:
        lines.append(f"   tx-queue {cls.queue}")
        if cls.strict:
            lines.append("      priority strict")
        else:
            lines += ["      no priority", f"      bandwidth percent {shares[cls.name]}"]
    for port in profile.ports or DEFAULT_PORTS:
        lines += [f"interface {port}", f"   service-profile {PROFILE}"]
    return lines


def render(profile: QosProfile) -> Rendering:
    lines = commands(profile)
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    return Rendering("eos", profile, "\n".join(lines) + "\n", None, notes, tuple(lines))
