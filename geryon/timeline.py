"""Timelines: Chrome/Perfetto traces of a job, one part per rank, merged by the launcher.

`--timeline FILE` reaches every rank (geryon.runtime.env.RankEnv.timeline). Each rank records into a
`RankTimeline`:
  - forward and backward of every leaf module, as complete ("X") spans on the rank's compute track;
  - every transfer the transport reports (`TransportConfig.tracer`, one `TransferEvent` per step),
    on one track per (direction, peer, class): the time a frame waited in its send queue as an
    async span ("queued"), its time on the wire as a complete span ("wire"), and each received frame
    as an instant ("received"). Urgent classes jumping the queue show as short "queued" spans on
    class 0 next to long ones on class 1;
  - with --sync partial, each group reduce the rank took part in, as a span ("group 12: 0,3,5,6")
    on its own track, so overlapping groups would show on one rank as overlapping spans.
At exit a rank writes its part next to FILE (`FILE.<rank>.part.json`); the launcher merges the
parts into FILE (`merge_parts`) when the job ends, and removes them. The format is the Trace Event
Format's JSON object form ({"traceEvents": [...]}), which chrome://tracing and ui.perfetto.dev load.
Timestamps are `time.time()` in microseconds, so ranks on one machine (local or emulated) line up.
"""

import atexit
import glob
import itertools
import json
import os
import threading
import time
import warnings

from geryon.safefiles import replace_file

PART_SUFFIX = ".part.json"
COMPUTE_TRACK = 0
GROUP_TRACK = 10_000       # after every transfer track
SERVER_PID_BASE = 1000


def part_path(timeline: str, rank_name: str) -> str:
    """Where rank `rank_name` writes its part of the trace FILE."""
    return f"{timeline}.{rank_name}{PART_SUFFIX}"


def rank_pid(rank_name: str) -> int:
    """The trace's process id of a rank: worker i is i + 1, server j is 1001 + j."""
    digits = "".join(ch for ch in rank_name if ch.isdigit()) or "0"
    base = SERVER_PID_BASE if rank_name.startswith("server") else 0
    return base + int(digits) + 1


def _us(t: float) -> float:
    return round(t * 1e6, 1)


class RankTimeline:
    """One rank's trace events, recorded from module hooks and the transport's tracer."""

    def __init__(self, path: str, rank_name: str):
        self.path, self.rank_name, self.pid = path, rank_name, rank_pid(rank_name)
        self.events: list[dict] = []
        self._tracks: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._queued: dict[tuple, float] = {}
        self._started: dict[tuple, float] = {}
        self._ids = itertools.count(1)
        self._group_track_named = False
        self.events.append({"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                            "args": {"name": rank_name}})
        self.events.append({"ph": "M", "name": "process_sort_index", "pid": self.pid, "tid": 0,
                            "args": {"sort_index": self.pid}})
        self._name_track(COMPUTE_TRACK, "compute (forward/backward per layer)")

    # -- recording ----------------------------------------------------------------------------
    def span(self, name: str, cat: str, start: float, end: float, track: int = COMPUTE_TRACK,
             args: dict | None = None) -> None:
        event = {"ph": "X", "name": name, "cat": cat, "pid": self.pid, "tid": track, "ts": _us(start),
                 "dur": max(0.0, round((end - start) * 1e6, 1))}
        if args:
            event["args"] = args
        self.events.append(event)

    def group(self, seq: int, members, start: float, end: float) -> None:
        """A partial-allreduce group reduce this rank took part in, from `start` to `end` (time.time())."""
        with self._lock:
            if not self._group_track_named:
                self._group_track_named = True
                self._name_track(GROUP_TRACK, "partial allreduce groups")
        members = ",".join(map(str, members))
        self.span(f"group {seq}: {members}", "group", start, end, GROUP_TRACK,
                  {"seq": seq, "members": members})

    def watch_module(self, model) -> None:
        """Record forward and backward of every leaf module of `model` as spans."""
        # The first layer's inputs need no gradient, so torch warns that its backward hook sees
        # outputs only; that is all a timeline needs.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are "
                                                  "computed with respect to module outputs")
        for name, module in model.named_modules():
            if any(True for _ in module.children()):
                continue
            label = name or type(module).__name__
            self._watch(module, label)

    def _watch(self, module, label: str) -> None:
        starts = {}

        def before_forward(_module, _inputs):
            starts["forward"] = time.time()

        def after_forward(_module, _inputs, _output):
            if "forward" in starts:
                self.span(f"forward {label}", "forward", starts.pop("forward"), time.time())

        def before_backward(_module, _grad_output):
            starts["backward"] = time.time()

        def after_backward(_module, _grad_input, _grad_output):
            if "backward" in starts:
                self.span(f"backward {label}", "backward", starts.pop("backward"), time.time())

        module.register_forward_pre_hook(before_forward)
        module.register_forward_hook(after_forward)
        try:
            module.register_full_backward_pre_hook(before_backward)
            module.register_full_backward_hook(after_backward)
        except RuntimeError:
            pass  # some modules cannot take backward hooks; their forward spans still show

    def transfer(self, event) -> None:
        """The transport's tracer: turn TransferEvents into queued / wire / received spans."""
        direction = "recv" if event.kind == "recv_done" else "send"
        track = self._track(direction, event.peer, event.cls)
        key = (event.flow, event.tensor_id, event.offset, event.iteration)
        label = f"t{event.tensor_id}+{event.offset}"
        args = {"tensor": event.tensor_id, "offset": event.offset, "bytes": event.nbytes,
                "iteration": event.iteration, "class": event.cls, "flow": event.flow}
        with self._lock:
            if event.kind == "queued":
                self._queued[key] = event.t
            elif event.kind == "send_start":
                self._started[key] = event.t
                queued = self._queued.pop(key, None)
                if queued is not None:
                    ident = next(self._ids)
                    common = {"name": f"queued {label}", "cat": f"queued,class{event.cls}",
                              "pid": self.pid, "tid": track, "id": ident}
                    self.events.append({**common, "ph": "b", "ts": _us(queued), "args": args})
                    self.events.append({**common, "ph": "e", "ts": _us(event.t)})
            elif event.kind == "send_done":
                started = self._started.pop(key, event.t)
                self.span(f"wire {label}", f"wire,class{event.cls}", started, event.t, track, args)
            elif event.kind == "recv_done":
                self.events.append({"ph": "i", "s": "t", "name": f"received {label}",
                                    "cat": f"received,class{event.cls}", "pid": self.pid, "tid": track,
                                    "ts": _us(event.t), "args": args})

    def _track(self, direction: str, peer: str, cls: int) -> int:
        key = (direction, peer, cls)
        track = self._tracks.get(key)
        if track is None:
            with self._lock:
                track = self._tracks.get(key)
                if track is None:
                    track = len(self._tracks) + 1
                    self._tracks[key] = track
                    arrow = "to" if direction == "send" else "from"
                    self._name_track(track, f"{direction} {arrow} {peer}, class {cls}")
        return track

    def _name_track(self, track: int, name: str) -> None:
        self.events.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": track,
                            "args": {"name": name}})
        self.events.append({"ph": "M", "name": "thread_sort_index", "pid": self.pid, "tid": track,
                            "args": {"sort_index": track}})

    # -- writing ------------------------------------------------------------------------------
    def save(self) -> str:
        """Write this rank's part (atomically); returns its path."""
        path = part_path(self.path, self.rank_name)
        with self._lock:
            events = list(self.events)
        replace_file(path, json.dumps({"traceEvents": events}))
        return path


_rank_timeline: RankTimeline | None = None


def rank_timeline(path: str | None, rank_name: str) -> RankTimeline | None:
    """This rank's timeline when the job has one (`path`; created once, saved at exit), else None."""
    global _rank_timeline
    if not path:
        return None
    if _rank_timeline is None:
        _rank_timeline = RankTimeline(path, rank_name)
        atexit.register(_rank_timeline.save)
    return _rank_timeline


def merge_parts(timeline: str, remove: bool = True) -> int:
    """Merge every rank's part of `timeline` into the file itself; returns the number of events."""
    parts = sorted(glob.glob(glob.escape(timeline) + ".*" + PART_SUFFIX))
    events: list[dict] = []
    ranks = []
    for part in parts:
        try:
            with open(part) as handle:
                events.extend(json.load(handle)["traceEvents"])
            ranks.append(os.path.basename(part)[len(os.path.basename(timeline)) + 1:-len(PART_SUFFIX)])
        except (OSError, ValueError, KeyError):
            continue  # a rank killed while writing: its part is skipped
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"producer": "geryon", "ranks": ranks}}
    replace_file(timeline, json.dumps(trace))
    if remove:
        for part in parts:
            try:
                os.remove(part)
            except OSError:
                pass
    return len(events)
