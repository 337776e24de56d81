"""Linux tc: the profile as `geryon.netconf` queue plans (HTB + u32 DSCP filters), one per port.

Follows tc-htb(8) and tc-u32(8) (iproute2), with the layout of `geryon.netconf.plan`: root `1:` htb whose
default is the profile's default class, `1:1` at the link rate, one HTB class per profile class, a pfifo
leaf under each, and u32 filters matching each non-default DSCP (IPv4 dsfield and IPv6 traffic class).

Strict classes get their own HTB `prio` (0, 1, ...) and the top one ~99% of the rate guaranteed, so it is
served first; weighted classes share the next `prio` level, with guaranteed rates and HTB quanta in
proportion to their weights, so when they borrow spare bandwidth they split it by weight.

Pure ACKs (`ack_priority`): the same two u32 filters as `geryon netconf`'s plan (`AckFilterOp`: TCP, flags
exactly ACK, IPv4 total length < 128 / IPv6 payload < 64), at prefs 1-2 ahead of the DSCP filters (3-4),
to the top class ("top") or to `1:f` ("own": HTB prio 0 above every class, ACK_SHARE of the rate
guaranteed and taken from the top class, ceil the link rate, as `geryon.netconf.plan` builds it).

On a host (and a Linux-based switch): IPv4 and IPv6 are classified alike (`match ip dsfield` and `match ip6
priority`); no queue is reserved for network control, because HTB guarantees every class its rate, so a
saturated top class cannot take the default class's (where CS6/CS7 land unless a class lists them) —
FRR on a Linux switch keeps that floor; `lossless = true` changes nothing here: PFC is the NIC's (e.g.
its DCB settings), not tc's. Verification: `tc -s class show dev <port>` (bytes, packets and drops per
class; `geryon cluster check` reads it).

Hazards:
  - HTB needs a rate: with none in the profile, 10 gbit is used, which never binds on a veth or 10G NIC.
  - GSO/TSO super-packets (up to 64 KB) are queued as one: at low rates a high packet can wait behind one
    (see NOTES, `ethtool -K IF tso off gso off`).
  - `tc qdisc del dev X root` runs first: whatever qdisc was there is replaced, so the apply path
    (geryon.netconf.linuxapply) saves it before and restores it on failure or `down`.
"""

from geryon.netconf.classes import PriorityClass
from geryon.netconf.plan import (HTB_QUANTUM, LOW_SHARE, MIN_CLASS_RATE, PARENT_CLASS, QUEUE_LIMIT, ROOT,
                                 UNSHAPED_RATE, ClassOp, FilterOp, QdiscOp, QueuePlan, ack_class_ops, ack_filter_ops,
                                 format_tc_rate, htb_class_params)
from geryon.errors import TargetLimitError
from geryon.netconf.qos_profile import QosProfile, TargetLimits
from geryon.netconf.render import Rendering

LIMITS = TargetLimits("linux", max_strict=8)
DEFAULT_PORTS = ("eth0",)
MIN_QUANTUM = 1514


def class_rates(profile: QosProfile, rate: int) -> list[int]:
    """Guaranteed rate per class: the top class the rest of ~99%, the others 1% split by weight."""
    count = len(profile.classes)
    if count == 1:
        return [rate]
    low_total = max(int(rate * LOW_SHARE), MIN_CLASS_RATE * (count - 1))
    if rate - low_total < rate // 2:
        raise TargetLimitError(f"linux: rate {format_tc_rate(rate)} is too low for {count} classes")
    weights = [cls.weight or 100 for cls in profile.classes[1:]]
    lows = [max(MIN_CLASS_RATE, low_total * w // sum(weights)) for w in weights]
    return [rate - sum(lows)] + lows


def build_plan(profile: QosProfile, dev: str, netns: str | None = None) -> QueuePlan:
    """The HTB plan for one device."""
    rate = profile.rate or UNSHAPED_RATE
    class_ids = tuple(f"1:{0x10 + i:x}" for i in range(len(profile.classes)))
    default_id = class_ids[[c.name for c in profile.classes].index(profile.default_class)]
    ops: list = [QdiscOp(dev, "htb", ROOT, params=(("default", default_id.split(":")[1]),)),
                 ClassOp(dev, "htb", PARENT_CLASS, ROOT, htb_class_params(rate, rate))]
    own = profile.ack_own
    rates = class_rates(profile, rate)
    if own:  # the ACK class's guarantee comes out of the top class's, as in geryon.netconf.plan
        ack_rate, ack_class_op, ack_leaf = ack_class_ops(dev, rate)
        if rates[0] - ack_rate < MIN_CLASS_RATE:
            raise TargetLimitError(f"linux: rate {format_tc_rate(rate)} is too low for a pure-ACK class: give a "
                                   "higher rate or ack_priority = 'top'")
        rates[0] -= ack_rate
        ops.append(ack_class_op)
    weighted_prio = len(profile.strict_classes) + int(own)
    for index, (cls, classid, class_rate) in enumerate(zip(profile.classes, class_ids, rates)):
        prio = index + int(own) if cls.strict else weighted_prio
        quantum = HTB_QUANTUM if cls.strict else max(MIN_QUANTUM, HTB_QUANTUM * cls.weight // 100)
        ops.append(ClassOp(dev, "htb", classid, PARENT_CLASS, htb_class_params(class_rate, rate, prio, quantum)))
    ops += [QdiscOp(dev, "pfifo", f"{0x10 + i:x}:", classid, (("limit", QUEUE_LIMIT),))
            for i, classid in enumerate(class_ids)]
    if own:
        ops.append(ack_leaf)
    ack_filters, first_pref = ack_filter_ops(dev, profile.ack_priority, class_ids[0], default_id)
    ops += ack_filters
    for pref, protocol in ((first_pref, "ip"), (first_pref + 1, "ipv6")):
        for cls, classid in zip(profile.classes, class_ids):
            if cls.name == profile.default_class:
                continue
            ops += [FilterOp(dev, ROOT, protocol, pref, dscp, classid) for dscp in cls.dscps]
    classes = tuple(PriorityClass(c.name, c.dscps[0] if c.dscps else 0) for c in profile.classes)
    return QueuePlan(dev, "htb", classes, class_ids, tuple(ops), rate, netns, profile.notes)


def plans(profile: QosProfile, netns: str | None = None) -> list[QueuePlan]:
    return [build_plan(profile, dev, netns) for dev in (profile.ports or DEFAULT_PORTS)]


def render(profile: QosProfile) -> Rendering:
    lines = [] if profile.ack_priority == "off" else [
        "# pure ACKs (TCP, flags exactly ACK, IPv4 length < 128 / IPv6 payload < 64) -> "
        + ("class 1:f, HTB prio 0 above every class" if profile.ack_own else "the top class")]
    for plan in plans(profile):
        lines.append(f"tc qdisc del dev {plan.dev} root 2>/dev/null || true")
        lines += plan.commands()
    commands = tuple(line for line in lines if not line.startswith("#"))
    notes = profile.notes + (() if profile.ports else
                             (f"no ports given: rendered for {', '.join(DEFAULT_PORTS)} (use --ports)",))
    verify = tuple(f"tc -s class show dev {dev}" for dev in profile.ports or DEFAULT_PORTS)
    if any(cls.lossless for cls in profile.classes):
        notes += ("lossless classes: tc has no PFC; set PFC for their priority on the NIC (DCB)",)
    return Rendering("linux", profile, "\n".join(lines) + "\n", None, notes, commands, verify)
