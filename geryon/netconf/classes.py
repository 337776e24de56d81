"""Priority classes: a name and a DSCP each, in strict order (index 0 is served first).

Owns the vocabulary every other part uses to talk about priorities: the defaults (two classes, high = EF
46 and low = best effort 0; more classes spread over CS/AF code points), the `--classes` syntax, and its
validation. Knows nothing of tc.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from geryon.errors import ClassSpecError

MAX_CLASSES = 8  # HTB has 8 priority levels (0..7); switches rarely offer more egress queues
HIGH_DSCP = 46  # EF, TOS byte 0xb8
LOW_DSCP = 0  # best effort
# Code points between EF and best effort, highest priority first (CS5, AF41, AF31, AF21, AF11, CS1).
_MIDDLE_DSCPS = (40, 34, 26, 18, 10, 8)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class PriorityClass:
    """One priority class: packets whose DSCP equals `dscp` belong to it."""

    name: str
    dscp: int

    @property
    def tos(self) -> int:
        """The IPv4 TOS byte (IPv6 traffic class) that carries this DSCP with ECN bits clear."""
        return self.dscp << 2


def default_classes(count: int = 2) -> tuple[PriorityClass, ...]:
    """Return `count` classes, highest first: 2 -> (high 46, low 0); more spread over CS/AF values."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_CLASSES:
        raise ClassSpecError(f"class count must be between 1 and {MAX_CLASSES}, got {count!r}")
    if count == 1:
        return (PriorityClass("low", LOW_DSCP),)
    middle_count = count - 2
    # CS5 (40) is only worth spending when all six middle slots are needed.
    pool = _MIDDLE_DSCPS if middle_count == len(_MIDDLE_DSCPS) else _MIDDLE_DSCPS[1:]
    dscps = (HIGH_DSCP, *pool[:middle_count], LOW_DSCP)
    return tuple(PriorityClass(_default_name(i, count), dscp) for i, dscp in enumerate(dscps))


def _default_name(index: int, count: int) -> str:
    if index == 0:
        return "high"
    if index == count - 1:
        return "low"
    if count == 3:
        return "medium"
    return f"p{index}"


def parse_classes(spec: "str | int | Iterable | None") -> tuple[PriorityClass, ...]:
    """Parse a class spec, highest priority first: "high:46,low:0", "46,26,0", "3" (a count), or None.

    Also accepts an int (a count), or an iterable of PriorityClass or (name, dscp) pairs, so callers can
    pass what the user gave them through unchanged. Raises ClassSpecError for anything invalid.
    """
    if spec is None:
        return default_classes()
    if isinstance(spec, int) and not isinstance(spec, bool):
        return default_classes(spec)
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ClassSpecError("empty class spec: give e.g. 'high:46,low:0' or a count such as 3")
        if text.isdigit():  # a bare number is a count; one class with a DSCP is written NAME:DSCP
            return default_classes(int(text))
        return validate_classes(_parse_entries(text))
    return validate_classes(_coerce_items(spec))


def _parse_entries(text: str) -> list[PriorityClass]:
    entries = [part.strip() for part in text.split(",")]
    if any(not part for part in entries):
        raise ClassSpecError(f"empty entry in class spec {text!r}: separate classes with single commas")
    classes = []
    for index, entry in enumerate(entries):
        name, sep, dscp_text = entry.rpartition(":")
        if not sep:
            name, dscp_text = _default_name(index, len(entries)), entry
        classes.append(PriorityClass(name.strip(), _parse_dscp(dscp_text.strip(), entry)))
    return classes


def _parse_dscp(text: str, entry: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise ClassSpecError(
            f"bad DSCP {text!r} in class {entry!r}: write NAME:DSCP with DSCP a number 0-63, "
            "e.g. high:46,low:0") from None


def _coerce_items(items: Iterable) -> list[PriorityClass]:
    try:
        items = list(items)
    except TypeError:
        raise ClassSpecError(f"cannot read priority classes from {items!r}") from None
    classes = []
    for item in items:
        if isinstance(item, PriorityClass):
            classes.append(item)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            classes.append(PriorityClass(str(item[0]), item[1]))
        else:
            raise ClassSpecError(f"cannot read a priority class from {item!r}: use (name, dscp)")
    return classes


def validate_classes(classes: "list[PriorityClass] | tuple[PriorityClass, ...]") -> tuple[PriorityClass, ...]:
    """Check count (1..8), names, DSCP range (0..63) and uniqueness; return them as a tuple."""
    if not 1 <= len(classes) <= MAX_CLASSES:
        raise ClassSpecError(
            f"{len(classes)} priority classes given; between 1 and {MAX_CLASSES} are supported "
            "(HTB has 8 priority levels)")
    for cls in classes:
        if not isinstance(cls.name, str) or not _NAME.fullmatch(cls.name):
            raise ClassSpecError(
                f"bad class name {cls.name!r}: start with a letter, then letters, digits, '-' or '_' "
                "(at most 32)")
        if not isinstance(cls.dscp, int) or isinstance(cls.dscp, bool) or not 0 <= cls.dscp <= 63:
            raise ClassSpecError(f"DSCP {cls.dscp!r} of class {cls.name!r} is outside 0-63")
    _reject_duplicates([cls.name for cls in classes], "class name")
    _reject_duplicates([cls.dscp for cls in classes], "DSCP")
    return tuple(classes)


def _reject_duplicates(values: list, what: str) -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise ClassSpecError(f"duplicate {what} {value!r}: each priority class needs its own {what}")
        seen.add(value)


def format_classes(classes: Iterable[PriorityClass]) -> str:
    """Render classes in the spec syntax parse_classes reads back ("high:46,low:0")."""
    return ",".join(f"{cls.name}:{cls.dscp}" for cls in classes)
