"""Read a geryon timeline (geryon/timeline.py's Trace Event JSON) into plain records.

A worker's compute track (tid 0) holds "forward <layer>" / "backward <layer>" complete spans; its
transfer tracks are named "send to <peer kind> <n>..., class <c>" / "recv from ...": sends have a
"queued" async span (b/e) and a "wire" complete span, receives an instant "received <tensor>".
Timestamps are microseconds; everything here is in seconds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from geryon.errors import ConfigError

TRACK = re.compile(r"^(send to|recv from) (\w+) (\d+).*class (\d+)")


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    name: str = ""


@dataclass(frozen=True)
class Transfer:
    """One data frame seen on one rank: a send (queued, wire start/end) or a receive (at `end`)."""

    direction: str          # "send" or "recv"
    peer_kind: str          # "worker" / "server" / "rank"
    peer: int
    cls: int
    tensor: int
    offset: int
    nbytes: int
    iteration: int
    end: float              # send: last byte to the kernel; recv: fully received
    start: float | None = None    # send: wire start
    queued: float | None = None   # send: entered the send queue


@dataclass
class Rank:
    name: str
    pid: int
    compute: list[Span] = field(default_factory=list)      # forward and backward, time order
    transfers: list[Transfer] = field(default_factory=list)

    @property
    def is_worker(self) -> bool:
        return not self.name.startswith("server")


def load_trace(path) -> dict[int, Rank]:
    """Ranks of a trace file by pid."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"{path} is not a Chrome trace (no traceEvents list)")
    return parse_events(events)


def parse_events(events: list[dict]) -> dict[int, Rank]:
    ranks: dict[int, Rank] = {}
    tracks: dict[tuple[int, int], tuple] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            ranks[e["pid"]] = Rank(e["args"]["name"], e["pid"])
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            match = TRACK.match(e["args"].get("name", ""))
            if match:
                tracks[(e["pid"], e["tid"])] = ("send" if match[1] == "send to" else "recv",
                                                match[2], int(match[3]), int(match[4]))
    queued: dict[int, tuple[float, dict]] = {}
    pending_wire: dict[tuple, float] = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        pid, ph = e.get("pid"), e.get("ph")
        if ph == "M" or pid is None:
            continue
        rank = ranks.setdefault(pid, Rank(f"pid{pid}", pid))
        t = e.get("ts", 0) * 1e-6
        cat = e.get("cat", "")
        if ph == "X" and cat in ("forward", "backward"):
            rank.compute.append(Span(t, t + e.get("dur", 0) * 1e-6, e.get("name", "")))
            continue
        track = tracks.get((pid, e.get("tid")))
        if track is None:
            continue
        direction, kind, peer, cls = track
        args = e.get("args", {})
        if ph == "b":
            queued[(pid, e.get("id"))] = t
        elif ph == "e":
            start = queued.pop((pid, e.get("id")), None)
            if start is not None:
                pending_wire[(pid, e.get("tid"), e.get("name", "")[len("queued "):])] = start
        elif ph == "X" and cat.startswith("wire"):
            label = e.get("name", "")[len("wire "):]
            q = pending_wire.pop((pid, e.get("tid"), label), None)
            rank.transfers.append(Transfer("send", kind, peer, cls, int(args.get("tensor", -1)),
                                           int(args.get("offset", 0)), int(args.get("bytes", 0)),
                                           int(args.get("iteration", -1)),
                                           t + e.get("dur", 0) * 1e-6, start=t, queued=q))
        elif ph == "i" and cat.startswith("received"):
            rank.transfers.append(Transfer("recv", kind, peer, cls, int(args.get("tensor", -1)),
                                           int(args.get("offset", 0)), int(args.get("bytes", 0)),
                                           int(args.get("iteration", -1)), t))
    for rank in ranks.values():
        rank.compute.sort(key=lambda s: s.start)
    return ranks
