"""QoS profiles: the priority classes of a fabric described once, validated before anything is touched.

A `QosProfile` names the classes, highest priority first — each with its DSCP values, the egress queue
it uses, and a scheduler (`strict`, or `weighted` with a weight 1..100) — plus the link rate and the
switch ports it applies to. Every renderer (`geryon.netconf.render`) turns the same profile into one
target's native configuration; `TargetLimits` says what a target can take, and `check_target` refuses a
profile that asks for more, with a message saying what to change.

Profiles come from three places: a TOML file (standard library `tomllib`), the built-ins `two-class` and
`four-class`, or the `--classes` spec the rest of geryon uses (`high:46,low:0`). A TOML file with
[[tenant]] tables describes the jobs sharing a fabric and becomes fabric classes (`geryon.netconf.tenants`).
The TOML form:

    name = "geryon-2"
    rate = "100gbit"                # optional; Linux HTB shapes at it, switches ignore it
    ports = ["Ethernet0", "Ethernet4"]

    [[class]]
    name = "high"
    dscp = [46]
    queue = 7
    scheduler = "strict"

    [[class]]
    name = "low"
    dscp = [0]
    queue = 0
    scheduler = "weighted"
    weight = 100
    default = true                  # DSCPs no class lists land here (default: the last class)

A weighted class may say `min_share = 10`: that percent of the link is its floor even under the strict
classes. Linux tc guarantees it (the HTB class's rate, taken from the top class's); a switch target gives the
class its weight's share of what the strict classes leave, and says so in the rendering's notes.

A class may say `lossless = true`: PFC on its priority and ECN marking, as RoCE traffic needs. A class
that does not is lossy, and a target refuses to put it on a queue the platform keeps lossless by default
(`TargetLimits.lossless_queues`, e.g. SONiC's 3 and 4), naming the queue.

Network control (CONTROL_DSCPS: CS6 48 and CS7 56, the switches' routing protocols) is not a training
class: no class may list those DSCPs, and every switch target keeps them on a protected queue of their
own above every training class (`TargetLimits.control_queue`); a class there moves one queue down.

`ack_priority = "off" | "top" | "own"` (default "off", so existing profiles render as before) gives TCP pure
ACKs — TCP, flags exactly ACK among URG/ACK/PSH/RST/SYN/FIN, IPv4 total length < 128, the match of
`geryon.netconf.plan.AckFilterOp` — the top class's queue ("top") or a strict queue of their own one above
the top class ("own", capped at ACK_SHARE_PERCENT of the link where the target can cap a queue). "own"
needs the top class below queue 7. Each renderer says how close the target's match comes to that one
(`TargetLimits.ack_match`); a target that cannot match the packet length refuses the option, because a
flags-only match would also take every bulk data segment sent without PSH.
"""

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from geryon.errors import QosProfileError, RateError, TargetLimitError
from geryon.netconf.classes import HIGH_DSCP, LOW_DSCP, parse_classes
from geryon.netconf.plan import ACK_IPV4_MAX_LEN, ACK_MODES, ACK_SHARE
from geryon.rates import parse_rate

STRICT = "strict"
WEIGHTED = "weighted"
SCHEDULERS = (STRICT, WEIGHTED)
NUM_DSCPS = 64
MAX_QUEUE = 7
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_PORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./:-]{0,63}$")
_CLASS_KEYS = {"name", "dscp", "queue", "scheduler", "weight", "default", "lossless", "min_share"}
MAX_MIN_SHARE = 50  # percent of the link all min_share floors together may take
_PROFILE_KEYS = {"name", "rate", "ports", "class", "description", "ack_priority"}
ACK_OFF = "off"
CONTROL_DSCPS = (48, 56)  # CS6, CS7: routing protocols and network control (RFC 4594), never a training class
CONTROL_SHARE_PERCENT = 5  # the control queue's share where a target caps or guarantees it
STRICT_GUARD_PERCENT = 100 - CONTROL_SHARE_PERCENT  # the shaper on a strict class where the vendor asks for one
PLATFORM_LOSSLESS_QUEUES = (3, 4)  # SONiC's stock lossless TCs (qos_config.j2 LOSSLESS_TC); QFX fcoe/no-loss
ACK_SHARE_PERCENT = round(ACK_SHARE * 100)  # "own": the ACK queue's cap where a target can shape a queue
ACK_MAX_LEN = ACK_IPV4_MAX_LEN  # pure ACKs: IPv4 total length below this (see geryon.netconf.plan)
# ack_match values of TargetLimits
ACK_EXACT = "exact"  # flags exactly ACK and length < 128, as AckFilterOp
ACK_APPROX = "approx"  # ACK set (other flags not checked) and length < 128: also small SYN-ACK/FIN/PSH segments


@dataclass(frozen=True)
class QosClass:
    """One class: packets with any of `dscps` go to egress `queue`, served by `scheduler`."""

    name: str
    dscps: tuple[int, ...]
    queue: int
    scheduler: str = WEIGHTED
    weight: int | None = None
    lossless: bool = False  # PFC on its priority and ECN (RoCE); lossy classes avoid the platform's lossless queues
    min_share: int | None = None  # percent of the link guaranteed under the strict classes (weighted only)

    @property
    def strict(self) -> bool:
        return self.scheduler == STRICT


@dataclass(frozen=True)
class QosProfile:
    """Classes highest first, the class that takes unlisted DSCPs, link rate (bits/s) and ports."""

    name: str
    classes: tuple[QosClass, ...]
    default_class: str
    rate: int | None = None
    ports: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    ack_priority: str = ACK_OFF  # "off", "top" or "own" (see the module docstring)

    def dscp_map(self) -> dict[int, QosClass]:
        """Every DSCP 0..63 -> the class it lands in (unlisted ones go to the default class)."""
        default = self.by_name(self.default_class)
        mapping = {dscp: default for dscp in range(NUM_DSCPS)}
        for cls in self.classes:
            for dscp in cls.dscps:
                mapping[dscp] = cls
        return mapping

    def by_name(self, name: str) -> QosClass:
        for cls in self.classes:
            if cls.name == name:
                return cls
        raise QosProfileError(f"profile {self.name!r} has no class {name!r}")

    def with_ports(self, ports) -> "QosProfile":
        return validate_profile(replace(self, ports=tuple(ports)))

    @property
    def weighted(self) -> tuple[QosClass, ...]:
        return tuple(cls for cls in self.classes if not cls.strict)

    @property
    def strict_classes(self) -> tuple[QosClass, ...]:
        return tuple(cls for cls in self.classes if cls.strict)

    @property
    def ack_queue(self) -> int | None:
        """The queue pure ACKs go to: None (off), the top class's ("top"), or the one above it ("own")."""
        if self.ack_priority == "top":
            return self.classes[0].queue
        if self.ack_priority == "own":
            return self.classes[0].queue + 1
        return None

    @property
    def ack_own(self) -> bool:
        return self.ack_priority == "own"


@dataclass(frozen=True)
class TargetLimits:
    """What one switch target accepts."""

    target: str
    max_strict: int = 8
    control_queue: int | None = None  # where CONTROL_DSCPS go, above every class; a class there moves one down
    control_why: str = ""
    lossless_queues: tuple[int, ...] = ()  # lossless (PFC) by the platform's defaults: no lossy class there
    lossless_why: str = ""
    lossless_fixed: bool = False  # a lossless class must sit on one of lossless_queues (buffers are the platform's)
    lossless_refused: str = ""  # why this target cannot render a lossless class (empty: it can)
    percent_weights: bool = False  # weights become percentages that must sum to exactly 100
    needs_weighted_default: bool = False  # the default (catch-all) queue must be weighted
    ack_match: str | None = ACK_EXACT  # how close its pure-ACK match comes (ACK_EXACT, ACK_APPROX, None: none)
    ack_why: str = ""  # what the target's ACK match lacks (a note for ACK_APPROX, the refusal for None)
    min_share: bool = False  # guarantees a class's min_share under the strict classes (else: a note)


# --- building profiles -------------------------------------------------------------------------


def validate_profile(profile: QosProfile) -> QosProfile:
    """Check names, DSCPs (0..63, no overlap), queues (0..7, unique, falling with priority), schedulers."""
    classes = profile.classes
    if not 1 <= len(classes) <= MAX_QUEUE + 1:
        raise QosProfileError(f"profile {profile.name!r} has {len(classes)} classes; give 1 to 8 "
                              "(switches have 8 egress queues)")
    if not isinstance(profile.name, str) or not _NAME.match(profile.name):
        raise QosProfileError(f"bad profile name {profile.name!r}: start with a letter, then letters, digits, "
                              "'-' or '_' (at most 32)")
    seen_names: set[str] = set()
    owner: dict[int, str] = {}
    queues: dict[int, str] = {}
    for cls in classes:
        where = f"class {cls.name!r} of profile {profile.name!r}"
        if not isinstance(cls.name, str) or not _NAME.match(cls.name):
            raise QosProfileError(f"bad class name {cls.name!r}: start with a letter, then letters, digits, "
                                  "'-' or '_' (at most 32)")
        if cls.name in seen_names:
            raise QosProfileError(f"two classes are named {cls.name!r} in profile {profile.name!r}")
        seen_names.add(cls.name)
        for dscp in cls.dscps:
            if not _is_int(dscp) or not 0 <= dscp < NUM_DSCPS:
                raise QosProfileError(f"DSCP {dscp!r} of {where} is outside 0-63")
            if dscp in CONTROL_DSCPS:
                raise QosProfileError(f"DSCP {dscp} of {where} is network control (CS6 48 / CS7 56: routing "
                                      "protocols), which every switch target keeps on its own protected queue: "
                                      "mark training traffic with another DSCP")
            if dscp in owner:
                raise QosProfileError(f"DSCP {dscp} is in both class {owner[dscp]!r} and class {cls.name!r}: "
                                      "each DSCP value may belong to one class only")
            owner[dscp] = cls.name
        if not _is_int(cls.queue) or not 0 <= cls.queue <= MAX_QUEUE:
            raise QosProfileError(f"queue {cls.queue!r} of {where} is outside 0-{MAX_QUEUE}")
        if cls.queue in queues:
            raise QosProfileError(f"classes {queues[cls.queue]!r} and {cls.name!r} both use queue {cls.queue}: "
                                  "give each class its own queue")
        queues[cls.queue] = cls.name
        _check_scheduler(cls, where)
        if not isinstance(cls.lossless, bool):
            raise QosProfileError(f"lossless of {where} must be true or false, got {cls.lossless!r}")
        _check_min_share(cls, where)
    _check_order(profile)
    floors = sum(cls.min_share or 0 for cls in classes)
    if floors > MAX_MIN_SHARE:
        raise QosProfileError(f"the min_share floors of profile {profile.name!r} add up to {floors}%: keep them at "
                              f"{MAX_MIN_SHARE}% or less, so the strict classes keep most of the link")
    if profile.default_class not in seen_names:
        raise QosProfileError(f"default class {profile.default_class!r} is not a class of profile "
                              f"{profile.name!r}")
    for port in profile.ports:
        if not isinstance(port, str) or not _PORT.match(port):
            raise QosProfileError(f"bad port name {port!r} in profile {profile.name!r}")
    if len(set(profile.ports)) != len(profile.ports):
        raise QosProfileError(f"a port is listed twice in profile {profile.name!r}: {', '.join(profile.ports)}")
    _check_ack(profile)
    return profile


def _check_ack(profile: QosProfile) -> None:
    if profile.ack_priority not in ACK_MODES:
        raise QosProfileError(f"ack_priority {profile.ack_priority!r} of profile {profile.name!r}: give one of "
                              f"{', '.join(repr(m) for m in ACK_MODES)} (off: no pure-ACK class; top: pure ACKs "
                              "in the top class's queue; own: a strict queue of their own above it)")
    if profile.ack_own and profile.classes[0].queue >= MAX_QUEUE:
        raise QosProfileError(f"ack_priority 'own' puts pure ACKs one queue above the top class, but class "
                              f"{profile.classes[0].name!r} of profile {profile.name!r} is on queue "
                              f"{profile.classes[0].queue}, the highest: move the classes down one queue or use "
                              "ack_priority = 'top'")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scheduler(cls: QosClass, where: str) -> None:
    if cls.scheduler not in SCHEDULERS:
        raise QosProfileError(f"scheduler {cls.scheduler!r} of {where} is neither 'strict' nor 'weighted'")
    if cls.strict and cls.weight is not None:
        raise QosProfileError(f"{where} is strict and also has a weight: a strict queue is served before "
                              "every weighted one, so drop the weight or make it 'weighted'")
    if not cls.strict and (not _is_int(cls.weight) or not 1 <= cls.weight <= 100):
        raise QosProfileError(f"{where} is weighted and needs a weight from 1 to 100, got {cls.weight!r}")


def _check_min_share(cls: QosClass, where: str) -> None:
    if cls.min_share is None:
        return
    if not _is_int(cls.min_share) or not 1 <= cls.min_share <= MAX_MIN_SHARE:
        raise QosProfileError(f"min_share {cls.min_share!r} of {where} must be a whole percent from 1 to "
                              f"{MAX_MIN_SHARE}")
    if cls.strict:
        raise QosProfileError(f"{where} is strict and has a min_share: a floor is for a weighted class under the "
                              "strict ones; drop min_share or make the class 'weighted'")


def _check_order(profile: QosProfile) -> None:
    """Strict classes come first, and a higher class uses a higher queue (switches serve queue 7 first)."""
    for upper, lower in zip(profile.classes, profile.classes[1:]):
        if lower.strict and not upper.strict:
            raise QosProfileError(f"strict class {lower.name!r} is listed below weighted class {upper.name!r}: "
                                  "list classes highest priority first, strict ones before weighted ones")
        if lower.queue > upper.queue:
            raise QosProfileError(f"class {upper.name!r} (queue {upper.queue}) is listed above class "
                                  f"{lower.name!r} (queue {lower.queue}): a higher class needs a higher queue")


def read_toml(path: Path, what: str, error: type[Exception] = QosProfileError, missing: str = "") -> dict:
    """The parsed TOML file `path` (a `what`: "profile", "inventory"); `error` says it is missing (then
    `missing`, a hint, follows), unreadable or not TOML."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist{missing}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path} is not valid TOML: {exc}") from exc


def refuse_unknown_keys(table: dict, known: "set[str] | frozenset[str]", where: str) -> None:
    """QosProfileError naming the keys of `table` outside `known` (and the known ones), after `where`
    ("FILE:", "FILE: class #2 has")."""
    unknown = set(table) - known
    if unknown:
        raise QosProfileError(f"{where} unknown key(s) {', '.join(sorted(unknown))}; "
                              f"known: {', '.join(sorted(known))}")


def fabric_rate_and_ports(data: dict, source: str) -> "tuple[int | None, tuple[str, ...]]":
    """A file's `rate` (parsed; None when absent) and `ports` (a list of names; none when absent)."""
    rate = data.get("rate")
    try:
        rate = None if rate is None else parse_rate(rate)
    except RateError as exc:
        raise QosProfileError(f"{source}: {exc}") from None
    ports = data.get("ports", [])
    if not isinstance(ports, list):
        raise QosProfileError(f"{source}: ports must be a list of names, e.g. [\"Ethernet0\", \"Ethernet4\"]")
    return rate, tuple(ports)


def load_profile(path: "str | Path") -> QosProfile:
    """Read and validate a TOML profile; QosProfileError says what is wrong and where."""
    path = Path(path)
    data = read_toml(path, "profile", missing=f"; built-ins: {', '.join(BUILTINS)}")
    from geryon.netconf import tenants  # a tenants file ([[tenant]] tables) compiles to fabric classes

    if tenants.is_tenants_file(data):
        return tenants.tenant_profile(tenants.tenants_from_dict(data, default_name=path.stem, source=str(path)))
    return profile_from_dict(data, default_name=path.stem, source=str(path))


def profile_from_dict(data: dict, default_name: str = "profile", source: str = "profile") -> QosProfile:
    """Build a profile from parsed TOML (see the module docstring for the keys)."""
    refuse_unknown_keys(data, _PROFILE_KEYS, f"{source}:")
    entries = data.get("class")
    if not isinstance(entries, list) or not entries:
        raise QosProfileError(f"{source}: no [[class]] tables; give one per priority class, highest first")
    classes, default = [], None
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise QosProfileError(f"{source}: class #{index + 1} is not a table")
        refuse_unknown_keys(entry, _CLASS_KEYS, f"{source}: class #{index + 1} has")
        missing = {"name", "dscp", "queue"} - set(entry)
        if missing:
            raise QosProfileError(f"{source}: class #{index + 1} lacks {', '.join(sorted(missing))}")
        dscps = entry["dscp"]
        dscps = tuple(dscps) if isinstance(dscps, list) else (dscps,)
        classes.append(QosClass(entry["name"], dscps, entry["queue"], entry.get("scheduler", WEIGHTED),
                                entry.get("weight"), entry.get("lossless", False), entry.get("min_share")))
        if entry.get("default"):
            if default is not None:
                raise QosProfileError(f"{source}: classes {default!r} and {entry['name']!r} are both default")
            default = entry["name"]
    rate, ports = fabric_rate_and_ports(data, source)
    name = data.get("name", default_name)
    ack = data.get("ack_priority", ACK_OFF)
    if not isinstance(ack, str):
        raise QosProfileError(f"{source}: ack_priority must be a string, one of "
                              f"{', '.join(repr(m) for m in ACK_MODES)}; got {ack!r}")
    return validate_profile(QosProfile(name, tuple(classes), default or classes[-1].name, rate, ports,
                                       ack_priority=ack))


# Up to 5 classes clear of PLATFORM_LOSSLESS_QUEUES; 6 and 7 leave queue 6 free for the top class, which
# every switch target moves there from 7 (network control's); 8 fit only targets without a control queue.
_SPREAD = {1: [0], 2: [7, 0], 3: [7, 5, 0], 4: [7, 5, 2, 0], 5: [7, 5, 2, 1, 0], 6: [7, 5, 4, 2, 1, 0],
           7: [7, 5, 4, 3, 2, 1, 0]}


def _queues_for(count: int) -> list[int]:
    """Queues for `count` lossy classes, highest class on queue 7 (see _SPREAD)."""
    if count in _SPREAD:
        return _SPREAD[count]
    return [round(MAX_QUEUE * (count - 1 - i) / (count - 1)) for i in range(count)]


def profile_from_classes(spec=None, name: str | None = None, rate=None, ports=()) -> QosProfile:
    """A profile from a `--classes` spec: the top class strict on queue 7, the rest weighted below it."""
    classes = parse_classes(spec)
    queues = _queues_for(len(classes))
    built = []
    for index, (cls, queue) in enumerate(zip(classes, queues)):
        if index == 0 and len(classes) > 1:
            built.append(QosClass(cls.name, (cls.dscp,), queue, STRICT))
        else:
            built.append(QosClass(cls.name, (cls.dscp,), queue, WEIGHTED, 10 * (len(classes) - index)))
    rate = None if rate is None else parse_rate(rate)
    return validate_profile(QosProfile(name or f"geryon-{len(classes)}", tuple(built), built[-1].name, rate,
                                       tuple(ports)))


def builtin_profile(name: str) -> QosProfile:
    """`two-class` (EF 46 strict, the rest best effort) or `four-class` (EF strict, AF41, AF21, rest)."""
    if name in ("two-class", "2"):
        classes = (QosClass("high", (HIGH_DSCP,), 7, STRICT),
                   QosClass("low", (LOW_DSCP,), 0, WEIGHTED, 100))
        return validate_profile(QosProfile("geryon-2", classes, "low"))
    if name in ("four-class", "4"):
        classes = (QosClass("high", (HIGH_DSCP,), 7, STRICT),
                   QosClass("p1", (34,), 5, WEIGHTED, 50),
                   QosClass("p2", (18,), 2, WEIGHTED, 30),
                   QosClass("low", (LOW_DSCP,), 0, WEIGHTED, 20))
        return validate_profile(QosProfile("geryon-4", classes, "low"))
    raise QosProfileError(f"no built-in profile {name!r}: choose one of {', '.join(BUILTINS)}, "
                          "or give a TOML file")


BUILTINS = ("two-class", "four-class")


def resolve_profile(profile: str | None = None, classes=None, rate=None, ports=None,
                    ack_priority: str | None = None) -> QosProfile:
    """The profile a command asked for: a built-in name, a TOML path, or a `--classes` spec.

    `ack_priority` (the `--ack-priority` option) overrides the profile's own setting."""
    if profile and classes:
        raise QosProfileError("give --profile or --classes, not both")
    if profile:
        built = builtin_profile(profile) if profile in BUILTINS or profile in ("2", "4") else load_profile(profile)
    else:
        built = profile_from_classes(classes)
    if rate is not None:
        built = validate_profile(replace(built, rate=parse_rate(rate)))
    if ports:
        built = built.with_ports(ports)
    if ack_priority is not None:
        built = validate_profile(replace(built, ack_priority=ack_priority))
    return built


# --- what a target can take --------------------------------------------------------------------


def check_target(profile: QosProfile, limits: TargetLimits) -> QosProfile:
    """The profile as this target will carry it (reserved queues moved), or TargetLimitError."""
    strict = profile.strict_classes
    _check_target_ack(profile, limits)
    if len(strict) > limits.max_strict:
        raise TargetLimitError(
            f"{limits.target} allows {limits.max_strict} strict queue(s) but profile {profile.name!r} has "
            f"{len(strict)} ({', '.join(c.name for c in strict)}): make the lower ones 'weighted'")
    if limits.needs_weighted_default and profile.by_name(profile.default_class).strict:
        raise TargetLimitError(f"{limits.target} needs the default class ({profile.default_class!r}) to be "
                               "weighted: it takes every unmatched packet and must not starve the rest")
    notes = list(profile.notes)
    classes = list(profile.classes)
    used = {cls.queue for cls in classes}
    for index, cls in enumerate(classes):
        if cls.queue == limits.control_queue:
            target_queue = cls.queue - 1
            if target_queue in used:
                raise TargetLimitError(
                    f"{limits.target}: queue {cls.queue} is reserved ({limits.control_why}) and queue "
                    f"{target_queue} is taken: move class {cls.name!r} to a free queue below {cls.queue}")
            classes[index] = replace(cls, queue=target_queue)
            used = (used - {cls.queue}) | {target_queue}
            notes.append(f"class {cls.name!r} moved from queue {cls.queue} to {target_queue}: {limits.control_why}")
    _check_lossless(profile.name, classes, limits)
    if limits.percent_weights:
        percentages([cls.weight for cls in profile.weighted], limits.target, profile.weighted)
    if not limits.min_share:
        notes += [f"class {cls.name!r}: min_share {cls.min_share}% is not guaranteed on {limits.target}; the class "
                  "gets its weight's share of what the strict classes leave" for cls in classes if cls.min_share]
    if profile.ack_priority != ACK_OFF and limits.ack_match == ACK_APPROX:
        notes.append(f"WARNING: pure-ACK match on {limits.target} is approximate: {limits.ack_why}")
    return replace(profile, classes=tuple(classes), notes=tuple(notes))


def _check_lossless(name: str, classes: list[QosClass], limits: TargetLimits) -> None:
    """A lossy class never lands on a queue the platform keeps lossless; a lossless one where the target can."""
    for cls in classes:
        if cls.lossless and limits.lossless_refused:
            raise TargetLimitError(f"{limits.target} cannot carry lossless class {cls.name!r} of profile {name!r}: "
                                   f"{limits.lossless_refused}")
        if not cls.lossless and cls.queue in limits.lossless_queues:
            raise TargetLimitError(
                f"{limits.target}: class {cls.name!r} of profile {name!r} is lossy but queue {cls.queue} is lossless "
                f"(PFC) by the platform's defaults ({limits.lossless_why}): move the class to another queue, or "
                "set lossless = true if its traffic is RoCE that needs PFC")
        if cls.lossless and limits.lossless_fixed and cls.queue not in limits.lossless_queues:
            raise TargetLimitError(
                f"{limits.target}: class {cls.name!r} of profile {name!r} is lossless, which this target gives only "
                f"queue(s) {', '.join(map(str, limits.lossless_queues))} ({limits.lossless_why}): move it there")


def _check_target_ack(profile: QosProfile, limits: TargetLimits) -> None:
    """Refuse an ACK class the target cannot express (no length match, too many strict queues, reserved queue)."""
    if profile.ack_priority == ACK_OFF:
        return
    if limits.ack_match is None:
        raise TargetLimitError(f"{limits.target} cannot give pure ACKs a queue: {limits.ack_why}. Set ack_priority = "
                               "'off' in the profile (or --ack-priority off) for this target")
    if profile.ack_own:
        queue = profile.ack_queue
        if len(profile.strict_classes) + 1 > limits.max_strict:
            raise TargetLimitError(
                f"{limits.target} allows {limits.max_strict} strict queue(s); ack_priority 'own' adds a strict "
                f"pure-ACK queue to the {len(profile.strict_classes)} strict class(es) of profile {profile.name!r}: "
                "use ack_priority = 'top' (pure ACKs in the top class's queue)")
        if queue == limits.control_queue:
            raise TargetLimitError(
                f"{limits.target}: ack_priority 'own' would put pure ACKs on queue {queue}, which is reserved "
                f"({limits.control_why}): move the classes down so the top one is on queue {queue - 2} or lower, "
                "or use ack_priority = 'top'")


def percentages(weights: list[int], target: str = "target", classes=()) -> list[int]:
    """Weights as whole percentages summing to exactly 100 (largest remainder), each at least 1."""
    if not weights:
        return []
    total = sum(weights)
    exact = [100 * w / total for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[:100 - sum(shares)]:
        shares[i] += 1
    for i, share in enumerate(shares):
        if share < 1:
            name = classes[i].name if classes else f"#{i + 1}"
            raise TargetLimitError(
                f"{target} needs whole bandwidth percentages summing to 100, and weight {weights[i]} of class "
                f"{name!r} is below 1% of the total {total}: raise it or lower the others")
    return shares
