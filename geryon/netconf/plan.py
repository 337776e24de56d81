"""Queue plans: the tc configuration of one interface, built as plain data before anything is applied.

A `QueuePlan` is a tuple of frozen operations (`QdiscOp`, `ClassOp`, `FilterOp`) plus the priority
classes they implement. `.commands()` renders the equivalent `tc` lines, so a plan can be shown to a user
(`geryon netconf show`) or tested without root; `geryon.netconf.apply` is the one place that applies it.

Layouts:
  htb      root `1:` htb (default = lowest class) -> `1:1` at the link rate -> one child per priority,
           `1:10`, `1:11`, ...; the highest gets ~99% guaranteed, the others share 1%; all may borrow up
           to 100%, and HTB serves lower `prio` numbers first, which makes the order strict. u32 filters
           map each non-default class's DSCP (IPv4 dsfield and IPv6 traffic class) to its class.
           With `ack_priority`, two u32 filters ahead of them (prefs 1-2; the DSCP filters move to
           3-4) send TCP pure ACKs, whatever their DSCP (`AckFilterOp`), either to the top priority
           class ("top") or to a class of their own above every priority class ("own": `1:f`, HTB
           prio 0, ACK_SHARE of the rate guaranteed, taken from the top class; the others' prio +1).
  prio/ets a strict-priority qdisc without shaping (real hosts, when no rate is wanted): bands `1:1`,
           `1:2`, ..., priomap sending unclassified traffic to the lowest band, the same DSCP filters.
  shaping  HTB at a rate with a single class and no priority (the "without queues" baseline).
Every class gets a pfifo leaf with an explicit limit so queue lengths do not depend on txqueuelen.
"""

from dataclasses import dataclass, field

from geryon.netconf.capabilities import Capabilities
from geryon.netconf.classes import PriorityClass, parse_classes
from geryon.errors import ConfigError, RateError
from geryon.rates import parse_rate

# Rate used when no shaping is wanted but the kernel only has HTB: high enough never to be the
# bottleneck on a veth or a 10G NIC, so HTB only orders packets when the device itself backs up.
UNSHAPED_RATE = 10 * 10**9
HTB_QUANTUM = 15140  # 10 full-size frames; explicit, so HTB does not warn that rate/r2q is too big
# HTB's token buckets hold 1 ms of the class's rate plus a frame (tc's old default, rate/HZ + mtu at
# HZ=1000). Kernels with a 1 ns psched clock make tc default to rate/1e9 + mtu, one 1600 B frame: then
# each late HTB timer (a 64 KB GSO packet leaves the bucket in debt) is wire time lost for good.
# Measured on the emulated cluster at 1 Gbit/s: iperf3 909-940 Mbit/s with 1600 B, 950-956 with these
# (the bound is 956), every allreduce 2-3% faster; no change at 100 Mbit/s (docs/transport.md).
HTB_BURST_SECONDS = 0.001
HTB_BURST_FRAME = 1600
QUEUE_LIMIT = 1000  # packets per leaf pfifo, the Linux txqueuelen default
LOW_SHARE = 0.01  # fraction of the link guaranteed to all lower classes together
MIN_CLASS_RATE = 8000  # bits/s; HTB needs a positive guaranteed rate
ROOT = "1:"
PARENT_CLASS = "1:1"
_PRIOMAP_SLOTS = 16
_PROTOCOLS = {"ip": 0x0800, "ipv6": 0x86DD}
# A pure ACK (TCP, flags exactly ACK among URG/ACK/PSH/RST/SYN/FIN, no payload) is IPv4 20 + TCP 20 +
# options <= 40 bytes: 52 with timestamps, 64-80 with timestamps and 1-3 SACK/DSACK blocks. "IPv4 total
# length < 128" (mask 0xff80) keeps all of them (< 64 would miss every ACK carrying a SACK block, the
# ones loss recovery waits for) and admits only data segments of < 48 payload bytes sent without PSH.
# IPv6: payload length < 64 (TCP header and options, at most 60), next header TCP (no extension headers).
ACK_IPV4_MAX_LEN = 128
ACK_IPV6_MAX_PAYLOAD = 64
ACK_MODES = ("off", "top", "own")  # no ACK filter; ACKs in the top class; ACKs in a class above it
DEFAULT_ACK_MODE = "own"  # what ack_priority=True means
ACK_CLASS_ID = "1:f"  # "own": below 1:10, so the priority classes keep their ids
ACK_SHARE = 0.05  # "own": guaranteed to the ACK class (pure ACKs of a full reverse link take ~1-3%)


def parse_ack_priority(value) -> str:
    """'off', 'top' or 'own' from a mode name or a bool (True: DEFAULT_ACK_MODE); ConfigError otherwise."""
    if value is None or value is False:
        return "off"
    if value is True:
        return DEFAULT_ACK_MODE
    if value in ACK_MODES:
        return value
    raise ConfigError(f"ack priority {value!r}: give one of {', '.join(ACK_MODES)} (off: no pure-ACK filter; top: "
                      "pure ACKs in the top priority class; own: in a class of their own above it)")


def handle_to_int(handle: str) -> int:
    """Turn a tc handle such as '1:' or '1:10' (hex fields) into the 32-bit netlink value."""
    major, _, minor = handle.partition(":")
    return (int(major or "0", 16) << 16) | int(minor or "0", 16)


def int_to_handle(value: int) -> str:
    """Inverse of handle_to_int: 0x10010 -> '1:10'."""
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


def format_tc_rate(bits_per_s: int) -> str:
    """Render an exact rate in tc syntax, using the largest unit that divides it (99mbit, 1250kbit)."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"


def _render_params(params: tuple) -> list[str]:
    words = []
    for name, value in params:
        if name in ("rate", "ceil"):
            words += [name, format_tc_rate(value)]
        elif isinstance(value, tuple):  # e.g. priomap: one argument per element
            words += [name, *map(str, value)]
        else:
            words += [name, str(value)]
    return words


@dataclass(frozen=True)
class QdiscOp:
    """Add (or delete) a qdisc: `tc qdisc add dev DEV root|parent P handle H KIND PARAMS`."""

    dev: str
    kind: str
    handle: str
    parent: str = "root"
    params: tuple = ()  # ((name, value), ...) in tc order
    action: str = "add"

    def tc_args(self) -> list[str]:
        where = ["root"] if self.parent == "root" else ["parent", self.parent]
        return ["qdisc", self.action, "dev", self.dev, *where, "handle", self.handle, self.kind,
                *_render_params(self.params)]


@dataclass(frozen=True)
class ClassOp:
    """Add a class: `tc class add dev DEV parent P classid C KIND PARAMS`."""

    dev: str
    kind: str
    classid: str
    parent: str
    params: tuple = ()
    action: str = "add"

    def tc_args(self) -> list[str]:
        return ["class", self.action, "dev", self.dev, "parent", self.parent, "classid", self.classid,
                self.kind, *_render_params(self.params)]


@dataclass(frozen=True)
class FilterOp:
    """Add a DSCP filter: packets of `protocol` whose DSCP is `dscp` go to class `flowid`."""

    dev: str
    parent: str
    protocol: str  # "ip" or "ipv6"
    pref: int
    dscp: int
    flowid: str
    kind: str = "u32"  # or "flower"
    action: str = "add"

    def tc_args(self) -> list[str]:
        tos = f"{self.dscp << 2:#04x}"
        if self.kind == "flower":
            match = ["flower", "ip_tos", f"{tos}/0xfc"]  # flower's ip_tos is the IPv6 class too
        elif self.protocol == "ip":
            match = ["u32", "match", "ip", "dsfield", tos, "0xfc"]
        else:
            match = ["u32", "match", "ip6", "priority", tos, "0xfc"]
        return ["filter", self.action, "dev", self.dev, "parent", self.parent, "protocol", self.protocol,
                "pref", str(self.pref), *match, "flowid" if self.kind == "u32" else "classid", self.flowid]

    @property
    def ethertype(self) -> int:
        return _PROTOCOLS[self.protocol]

    def keys(self) -> list[tuple[int, int, int]]:
        """The one 32-bit u32 key (value, mask, offset) matching this DSCP."""
        # IPv4: TOS is the second byte of the header; IPv6: version(4) class(8) label(20)
        shift = 16 if self.protocol == "ip" else 20
        return [((self.dscp << 2) << shift, 0xFC << shift, 0)]

    def u32_key(self) -> str:
        """The same key for pyroute2 ('value/mask+offset')."""
        value, mask, offset = self.keys()[0]
        return f"{value:#010x}/{mask:#010x}+{offset}"

    def u32_keys(self) -> list[str]:
        return [self.u32_key()]


@dataclass(frozen=True)
class AckFilterOp:
    """Send TCP pure ACKs of `protocol` to class `flowid` (the wondershaper rule), whatever their DSCP.

    Matches TCP (IPv4 without IP options, or IPv6 without extension headers), the flag bits URG ACK PSH
    RST SYN FIN equal to ACK alone (ECE/CWR ignored), and a small packet (ACK_IPV4_MAX_LEN /
    ACK_IPV6_MAX_PAYLOAD). A receiver's ACKs then never queue behind bulk data on the way back.
    """

    dev: str
    parent: str
    protocol: str  # "ip" or "ipv6"
    pref: int
    flowid: str
    action: str = "add"
    kind = "u32"

    def tc_args(self) -> list[str]:
        if self.protocol == "ip":
            match = ["match", "ip", "protocol", "6", "0xff", "match", "u8", "0x05", "0x0f", "at", "0",
                     "match", "u16", "0x0000", f"{0x10000 - ACK_IPV4_MAX_LEN:#06x}", "at", "2",
                     "match", "u8", "0x10", "0x3f", "at", "33"]
        else:
            match = ["match", "ip6", "protocol", "6", "0xff",
                     "match", "u16", "0x0000", f"{0x10000 - ACK_IPV6_MAX_PAYLOAD:#06x}", "at", "4",
                     "match", "u8", "0x10", "0x3f", "at", "53"]
        return ["filter", self.action, "dev", self.dev, "parent", self.parent, "protocol", self.protocol,
                "pref", str(self.pref), "u32", *match, "flowid", self.flowid]

    @property
    def ethertype(self) -> int:
        return _PROTOCOLS[self.protocol]

    def keys(self) -> list[tuple[int, int, int]]:
        """The (value, mask, offset) 32-bit keys tc makes of `tc_args()`, offsets word-aligned."""
        if self.protocol == "ip":  # version/IHL + total length; protocol; TCP data offset/flags/window
            return [(0x05000000, 0x0F000000 | (0x10000 - ACK_IPV4_MAX_LEN), 0), (0x00060000, 0x00FF0000, 8),
                    (0x00100000, 0x003F0000, 32)]
        return [(0x00000600, ((0x10000 - ACK_IPV6_MAX_PAYLOAD) << 16) | 0xFF00, 4), (0x00100000, 0x003F0000, 52)]

    def u32_keys(self) -> list[str]:
        """The same match as pyroute2 keys (one per masked byte: see `pyroute2_keys`)."""
        return pyroute2_keys(self.keys())


def pyroute2_keys(keys) -> list[str]:
    """u32 keys (value, mask, offset) as pyroute2 'value/mask+offset' strings, one per masked byte.

    pyroute2 packs keys byte by byte and skips a zero mask byte inside a key without advancing the
    offset (0x0f00ff80 would land its 0xff on byte 1): single bytes are always packed where they belong.
    """
    out = []
    for value, mask, offset in keys:
        for i in range(4):
            shift = 24 - 8 * i
            byte_mask = (mask >> shift) & 0xFF
            if byte_mask:
                out.append(f"{(value >> shift) & byte_mask:#04x}/{byte_mask:#04x}+{offset + i}")
    return out


Operation = QdiscOp | ClassOp | FilterOp | AckFilterOp


@dataclass(frozen=True)
class QueuePlan:
    """The complete egress configuration of one device, as data."""

    dev: str
    layout: str  # "htb", "prio", "ets" or "shaping"
    classes: tuple[PriorityClass, ...]
    class_ids: tuple[str, ...]  # class_ids[i] is the tc class of classes[i]; shaping: one id, no class
    ops: tuple[Operation, ...]
    rate: int | None = None  # bits/s; None for an unshaped strict-priority qdisc
    netns: str | None = None
    notes: tuple[str, ...] = field(default=())

    def commands(self) -> list[str]:
        """The equivalent `tc` command lines (run them after deleting the device's root qdisc)."""
        prefix = ["tc", "-n", self.netns] if self.netns else ["tc"]
        return [" ".join(prefix + op.tc_args()) for op in self.ops]

    def class_for_dscp(self, dscp: int) -> str:
        """The tc class a packet with this DSCP lands in (unmatched DSCPs go to the lowest class)."""
        for cls, classid in zip(self.classes, self.class_ids):
            if cls.dscp == dscp:
                return classid
        return self.class_ids[-1]

    def with_netns(self, netns: str | None) -> "QueuePlan":
        return QueuePlan(self.dev, self.layout, self.classes, self.class_ids, self.ops, self.rate, netns,
                         self.notes)


def build_priority_plan(dev: str, classes=None, rate: "int | str | None" = None,
                        capabilities: Capabilities | None = None, netns: str | None = None,
                        queue_limit: int = QUEUE_LIMIT, ack_priority: "bool | str" = False) -> QueuePlan:
    """Plan strict priority queues for `classes` on `dev`, shaped at `rate` (bits/s or '100mbit').

    With rate None and a kernel offering prio or ets plus u32 or flower, plan an unshaped
    strict-priority qdisc; otherwise plan HTB (at UNSHAPED_RATE when rate is None). With `ack_priority`
    ('top', 'own' or True: see `parse_ack_priority`), TCP pure ACKs go to the top class or to one of their
    own above it, matched before any DSCP filter.
    """
    ack_priority = parse_ack_priority(ack_priority)
    classes = parse_classes(classes)
    caps = capabilities or Capabilities.baseline()
    if rate is None:
        qdisc, classifier = caps.strict_priority_qdisc(), caps.dscp_classifier()
        if qdisc and classifier:
            return _strict_plan(dev, classes, qdisc, classifier, netns, queue_limit, ack_priority)
        note = (f"no prio/ets qdisc with a DSCP classifier on this kernel: HTB at "
                f"{format_tc_rate(UNSHAPED_RATE)} orders packets without shaping")
        return _htb_plan(dev, classes, UNSHAPED_RATE, netns, queue_limit, (note,), ack_priority)
    return _htb_plan(dev, classes, parse_rate(rate), netns, queue_limit, ack_priority=ack_priority)


def build_shaping_plan(dev: str, rate: "int | str", netns: str | None = None,
                       queue_limit: int = QUEUE_LIMIT) -> QueuePlan:
    """Plan HTB shaping at `rate` with one class and no priority (every packet shares one FIFO)."""
    bits = parse_rate(rate)
    leaf = "1:10"
    ops = (
        QdiscOp(dev, "htb", ROOT, params=(("default", "10"),)),
        ClassOp(dev, "htb", PARENT_CLASS, ROOT, htb_class_params(bits, bits)),
        ClassOp(dev, "htb", leaf, PARENT_CLASS, htb_class_params(bits, bits)),
        QdiscOp(dev, "pfifo", "10:", leaf, (("limit", queue_limit),)),
    )
    return QueuePlan(dev, "shaping", (), (leaf,), ops, bits, netns)


def htb_class_params(rate: int, ceil: int, prio: int | None = None, quantum: int = HTB_QUANTUM) -> tuple:
    """An HTB class's parameters: rates in bits/s, its buckets sized by htb_burst()."""
    params = (("rate", rate), ("ceil", ceil))
    if prio is not None:
        params += (("prio", prio),)
    return params + (("quantum", quantum), ("burst", htb_burst(rate)), ("cburst", htb_burst(ceil)))


def htb_burst(rate: int) -> int:
    """Bytes an HTB class at `rate` bits/s may send at once: 1 ms of the rate plus one frame."""
    return int(rate * HTB_BURST_SECONDS) // 8 + HTB_BURST_FRAME


def _class_rates(rate: int, count: int) -> list[int]:
    if count == 1:
        return [rate]
    low = max(int(rate * LOW_SHARE) // (count - 1), MIN_CLASS_RATE)
    high = rate - low * (count - 1)
    if high < rate // 2:
        raise RateError(f"rate {format_tc_rate(rate)} is too low for {count} priority classes: "
                        f"give at least {format_tc_rate(2 * MIN_CLASS_RATE * (count - 1))}")
    return [high] + [low] * (count - 1)


def _htb_plan(dev, classes, rate, netns, queue_limit, notes=(), ack_priority="off") -> QueuePlan:
    class_ids = tuple(f"1:{0x10 + i:x}" for i in range(len(classes)))
    default_minor = class_ids[-1].split(":")[1]
    ops: list[Operation] = [
        QdiscOp(dev, "htb", ROOT, params=(("default", default_minor),)),
        ClassOp(dev, "htb", PARENT_CLASS, ROOT, htb_class_params(rate, rate)),
    ]
    own = ack_priority == "own"
    ack_rate, ack_class, ack_leaf = ack_class_ops(dev, rate, queue_limit) if own else (0, None, None)
    if own:
        ops.append(ack_class)
    rates = _class_rates(rate, len(classes))
    rates[0] -= ack_rate  # the ACK class's guarantee comes out of the top class's
    if rates[0] < MIN_CLASS_RATE:
        raise RateError(f"rate {format_tc_rate(rate)} is too low for a pure-ACK class above {len(classes)} "
                        "priority classes: give a higher rate or ack priority 'top'")
    for prio, (classid, class_rate) in enumerate(zip(class_ids, rates), start=int(own)):
        ops.append(ClassOp(dev, "htb", classid, PARENT_CLASS, htb_class_params(class_rate, rate, prio)))
    ops += _leaves(dev, class_ids, queue_limit)
    if own:
        ops.append(ack_leaf)
    ops += _filters(dev, classes, class_ids, "u32", ack_priority)
    return QueuePlan(dev, "htb", classes, class_ids, tuple(ops), rate, netns, tuple(notes))


def _strict_plan(dev, classes, qdisc, classifier, netns, queue_limit, ack_priority="off") -> QueuePlan:
    bands = max(len(classes), 2)  # prio needs at least two bands
    class_ids = tuple(f"1:{i + 1:x}" for i in range(len(classes)))
    priomap = (("priomap", (len(classes) - 1,) * _PRIOMAP_SLOTS),)
    params = (("bands", bands),) + ((("strict", bands),) if qdisc == "ets" else ()) + priomap
    ops: list[Operation] = [QdiscOp(dev, qdisc, ROOT, params=params)]
    ops += _leaves(dev, class_ids, queue_limit)
    notes: tuple = ()
    if ack_priority != "off" and classifier != "u32":
        notes = ("no pure-ACK filter: it needs u32 (flower cannot match a packet's length)",)
        ack_priority = "off"
    elif ack_priority == "own":
        notes = ("pure ACKs in the top band: a strict-priority qdisc here has no band above it",)
        ack_priority = "top"
    ops += _filters(dev, classes, class_ids, classifier, ack_priority)
    return QueuePlan(dev, qdisc, classes, class_ids, tuple(ops), None, netns, notes)


def ack_class_ops(dev: str, rate: int, queue_limit: int = QUEUE_LIMIT) -> tuple[int, ClassOp, QdiscOp]:
    """Ack priority "own": the guaranteed rate of the pure-ACK class (ACK_SHARE of `rate`, which the caller
    takes from the top class), the class ACK_CLASS_ID itself (HTB prio 0, above every priority class,
    ceil `rate`) and its pfifo leaf."""
    ack_rate = max(int(rate * ACK_SHARE), MIN_CLASS_RATE)
    return (ack_rate, ClassOp(dev, "htb", ACK_CLASS_ID, PARENT_CLASS, htb_class_params(ack_rate, rate, 0)),
            QdiscOp(dev, "pfifo", ACK_CLASS_ID.split(":")[1] + ":", ACK_CLASS_ID, (("limit", queue_limit),)))


def ack_filter_ops(dev: str, ack_priority: str, top_class: str, default_class: str) -> tuple[list, int]:
    """The pure-ACK u32 filters at prefs 1-2 (to ACK_CLASS_ID for "own", else `top_class`), unless the
    mode is off or that class is the qdisc's default anyway; and the first pref left for DSCP filters."""
    ack_class = ACK_CLASS_ID if ack_priority == "own" else top_class
    if ack_priority == "off" or ack_class == default_class:
        return [], 1
    return [AckFilterOp(dev, ROOT, protocol, pref, ack_class) for pref, protocol in ((1, "ip"), (2, "ipv6"))], 3


def _leaves(dev, class_ids, queue_limit) -> list[QdiscOp]:
    return [QdiscOp(dev, "pfifo", f"{0x10 + i:x}:", classid, (("limit", queue_limit),))
            for i, classid in enumerate(class_ids)]


def _filters(dev, classes, class_ids, classifier, ack_priority) -> list:
    """The pure-ACK filters (if asked, and their class is not the default one) then the DSCP filters.

    The lowest class needs no filter: it is the qdisc's default. u32 wants one protocol per pref, and
    tries lower prefs first, so the ACK filters take prefs 1-2 and the DSCP filters follow."""
    filters, first_dscp_pref = ack_filter_ops(dev, ack_priority, class_ids[0], class_ids[-1])
    for pref, protocol in ((first_dscp_pref, "ip"), (first_dscp_pref + 1, "ipv6")):
        for cls, classid in zip(classes[:-1], class_ids[:-1]):
            filters.append(FilterOp(dev, ROOT, protocol, pref, cls.dscp, classid, classifier))
    return filters
