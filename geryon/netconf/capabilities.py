"""What this kernel's traffic control offers, found by trying it, never assumed.

Each qdisc and classifier is tried with `tc` on a veth pair inside a throw-away namespace (`gycap...`),
so the machine's own interfaces are never touched; the namespace is always removed. The answer is
cached for the life of the process. Without root, nothing can be tried and `Capabilities.baseline()`
(HTB, pfifo and u32, which every Linux with tc has) stands in, marked `detected=False`.
"""

import os
import subprocess
import threading
import uuid
from dataclasses import dataclass

# Arguments that make each qdisc valid as a root qdisc on a 4-queue veth.
QDISC_TRIALS = {
    "htb": [],
    "pfifo": [],
    "prio": ["bands", "3"],
    "ets": ["bands", "3", "strict", "3"],
    "mqprio": ["num_tc", "2", "map", "0", "1", "queues", "1@0", "1@1", "hw", "0"],
    "tbf": ["rate", "1mbit", "burst", "10kb", "latency", "50ms"],
    "netem": [],
    "fq_codel": [],
    "fq": [],
}
# Classifiers are tried under an htb root; each names class 1:10.
CLASSIFIER_TRIALS = {
    "u32": ["protocol", "ip", "u32", "match", "ip", "dsfield", "0xb8", "0xfc", "flowid", "1:10"],
    "flower": ["protocol", "ip", "flower", "ip_tos", "0xb8/0xfc", "classid", "1:10"],
    "matchall": ["protocol", "all", "matchall", "classid", "1:10"],
    "basic": ["protocol", "ip", "basic", "classid", "1:10"],
}
_STRICT_QDISCS = ("prio", "ets")  # preference order for unshaped strict priority
_DSCP_CLASSIFIERS = ("u32", "flower")


@dataclass(frozen=True)
class Capabilities:
    """The qdiscs and classifiers the kernel accepted."""

    qdiscs: frozenset[str]
    classifiers: frozenset[str]
    detected: bool = True

    @classmethod
    def baseline(cls) -> "Capabilities":
        """What any Linux with tc offers; used when detection is impossible (no root)."""
        return cls(frozenset({"htb", "pfifo"}), frozenset({"u32"}), detected=False)

    def strict_priority_qdisc(self) -> str | None:
        """'prio' or 'ets' when available (prio first), else None."""
        return next((kind for kind in _STRICT_QDISCS if kind in self.qdiscs), None)

    def dscp_classifier(self) -> str | None:
        """'u32' or 'flower' when available (u32 first), else None."""
        return next((kind for kind in _DSCP_CLASSIFIERS if kind in self.classifiers), None)

    def as_dict(self) -> dict:
        return {"qdiscs": sorted(self.qdiscs), "classifiers": sorted(self.classifiers),
                "detected": self.detected, "strict_priority_qdisc": self.strict_priority_qdisc(),
                "dscp_classifier": self.dscp_classifier()}


_cache: Capabilities | None = None
_lock = threading.Lock()


def detect_capabilities(refresh: bool = False) -> Capabilities:
    """Return the kernel's capabilities, probing once per process (baseline when not root)."""
    global _cache
    with _lock:
        if _cache is None or refresh:
            _cache = _probe() if os.geteuid() == 0 else Capabilities.baseline()
        return _cache


def _probe() -> Capabilities:
    netns = f"gycap{uuid.uuid4().hex[:8]}"
    _run(["ip", "netns", "add", netns], check=True)
    try:
        _run(["ip", "-n", netns, "link", "add", "gyc0", "numtxqueues", "4", "type", "veth",
              "peer", "name", "gyc1", "numtxqueues", "4"], check=True)
        qdiscs = {kind for kind, args in QDISC_TRIALS.items() if _try_qdisc(netns, kind, args)}
        classifiers = set()
        if "htb" in qdiscs:
            classifiers = {kind for kind, args in CLASSIFIER_TRIALS.items()
                           if _try_classifier(netns, args)}
        return Capabilities(frozenset(qdiscs), frozenset(classifiers))
    finally:
        _run(["ip", "netns", "del", netns])


def _try_qdisc(netns: str, kind: str, args: list[str]) -> bool:
    ok = _run(["tc", "-n", netns, "qdisc", "add", "dev", "gyc0", "root", "handle", "1:", kind, *args])
    _run(["tc", "-n", netns, "qdisc", "del", "dev", "gyc0", "root"])
    return ok


def _try_classifier(netns: str, args: list[str]) -> bool:
    tc = ["tc", "-n", netns]
    _run(tc + ["qdisc", "add", "dev", "gyc0", "root", "handle", "1:", "htb"])
    _run(tc + ["class", "add", "dev", "gyc0", "parent", "1:", "classid", "1:10", "htb", "rate", "1mbit"])
    ok = _run(tc + ["filter", "add", "dev", "gyc0", "parent", "1:", "pref", "1", *args])
    _run(tc + ["qdisc", "del", "dev", "gyc0", "root"])
    return ok


def _run(argv: list[str], check: bool = False) -> bool:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        from geryon.errors import NetconfError
        raise NetconfError(f"capability probe failed: {' '.join(argv)}: {result.stderr.strip()}")
    return result.returncode == 0
