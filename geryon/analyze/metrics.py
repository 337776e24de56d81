"""Iteration metrics of a traced PS job: the Horovod timeline study's, and Caramel's overlap.

Per worker, a *round* (iteration) starts at a forward span that follows a backward span (or the
first forward) and ends where the next one starts; only complete rounds count. Per round:
    T   round length; C  compute time (union of forward/backward spans);
    N   communication time: the union of the wire spans of the worker's own sends and of the
        servers' sends to it, inside the round;
    rho = N / C; alpha (overlap) = (C + N - T) / min(C, N), clipped to [0, 1], the value for which
        Caramel's U = 1 / (1 + rho - alpha * min(rho, 1)) equals C / T;
    feed-forward  round start -> first push queued (Horovod: start of the first negotiation);
    idle (negotiation delay)  time after the first push with neither compute nor an own send
        queued or on the wire: waiting for parameters;
Per tensor (over rounds): back-propagation window = start of the round that reads the pulled
version (round v reads version v) - last slice of it received (negative: it arrived after that
round began); reaction bandwidth =
bytes / window; immutable bandwidth worst case = bytes / (own push end - round start), best case
= bytes / (time between two consecutive push ends of the tensor).
Urgent wait: per class, a frame's time from entering its send queue to its last byte on the wire
(worker pushes and server pulls); class 0 holds the urgent tensors under every policy.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from geryon.analyze.trace import Rank, Span


@dataclass
class RoundMetrics:
    worker: str
    index: int
    start: float
    T: float
    C: float
    N: float
    rho: float
    alpha: float
    U: float
    U_formula: float
    feed_forward: float
    idle: float


@dataclass
class TensorMetrics:
    tensor: int
    nbytes: int
    bp_window: float
    reaction_bw: float | None
    immutable_worst_bw: float | None
    immutable_best_bw: float | None


@dataclass
class Analysis:
    rounds: list[RoundMetrics] = field(default_factory=list)
    tensors: list[TensorMetrics] = field(default_factory=list)
    waits: dict[int, list[float]] = field(default_factory=dict)   # class -> seconds
    occupancy: dict[int, list[float]] = field(default_factory=dict)  # class -> per bin, one round
    occupancy_round: float = 0.0


def union_length(spans, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Total length covered by (start, end) pairs, clipped to [lo, hi]."""
    total, reach = 0.0, lo
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if end <= reach or end <= start:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def round_starts(compute: list[Span]) -> list[float]:
    starts, last = [], None
    for span in compute:
        kind = span.name.split(" ", 1)[0]
        if kind == "forward" and last != "forward":
            starts.append(span.start)
        last = kind
    return starts


def worker_index(rank: Rank) -> int:
    digits = "".join(ch for ch in rank.name if ch.isdigit())
    return int(digits) if digits else rank.pid - 1


def analyze(ranks: dict[int, Rank], bins: int = 100) -> Analysis:
    """Every metric of the module doc, for every worker with compute spans."""
    out = Analysis()
    servers = [r for r in ranks.values() if not r.is_worker]
    for rank in ranks.values():
        if not rank.is_worker or not rank.compute:
            continue
        index = worker_index(rank)
        sends = [t for t in rank.transfers if t.direction == "send"]
        incoming = [(t.start, t.end) for s in servers for t in s.transfers
                    if t.direction == "send" and t.peer == index and t.start is not None]
        wires = [(t.start, t.end) for t in sends if t.start is not None] + incoming
        starts = round_starts(rank.compute)
        pushes_by_tensor: dict[int, list[float]] = {}
        for t in sends:
            pushes_by_tensor.setdefault(t.tensor, []).append(t.end)
        for k in range(len(starts) - 1):
            lo, hi = starts[k], starts[k + 1]
            T = hi - lo
            C = union_length([(s.start, s.end) for s in rank.compute], lo, hi)
            N = union_length(wires, lo, hi)
            rho = N / C if C > 0 else float("inf")
            alpha = min(1.0, max(0.0, (C + N - T) / min(C, N))) if min(C, N) > 0 else 0.0
            u_formula = 1.0 / (1.0 + rho - alpha * min(rho, 1.0)) if C > 0 else 0.0
            mine = [t for t in sends if t.queued is not None and lo <= t.queued < hi]
            first = min((t.queued for t in mine), default=hi)
            busy = [(s.start, s.end) for s in rank.compute] + [(t.queued, t.end) for t in mine]
            idle = (hi - first) - union_length(busy, first, hi)
            out.rounds.append(RoundMetrics(rank.name, k, lo, T, C, N, rho, alpha, C / T if T else 0.0,
                                           u_formula, first - lo, idle))
        out.tensors.extend(_tensor_metrics(rank, starts, pushes_by_tensor))
        for t in sends:
            if t.queued is not None:
                out.waits.setdefault(t.cls, []).append(t.end - t.queued)
    for server in servers:
        for t in server.transfers:
            if t.direction == "send" and t.queued is not None:
                out.waits.setdefault(t.cls, []).append(t.end - t.queued)
    _occupancy(out, ranks, bins)
    return out


def _tensor_metrics(rank: Rank, starts: list[float], pushes: dict[int, list[float]]):
    received: dict[tuple[int, int], float] = {}   # (tensor, iteration) -> last slice received
    sizes: dict[tuple[int, int], int] = {}
    for t in rank.transfers:
        if t.direction == "recv":
            key = (t.tensor, t.iteration)
            received[key] = max(received.get(key, 0.0), t.end)
            sizes[key] = sizes.get(key, 0) + t.nbytes
    per_tensor: dict[int, list] = {}
    for (tensor, iteration), when in received.items():
        # version v of a parameter is read by round v (round k pushes iteration k, pulls k + 1)
        if not 0 < iteration < len(starts):
            continue
        per_tensor.setdefault(tensor, []).append((starts[iteration] - when, sizes[(tensor, iteration)]))
    result = []
    for tensor, items in sorted(per_tensor.items()):
        window = statistics.mean(w for w, _ in items)
        nbytes = max(b for _, b in items)
        ends = sorted(pushes.get(tensor, []))
        worst = best = None
        if ends and starts:
            gaps = [e - max(s for s in starts if s <= e) for e in ends if any(s <= e for s in starts)]
            if gaps and statistics.mean(gaps) > 0:
                worst = nbytes / statistics.mean(gaps)
            between = [b - a for a, b in zip(ends, ends[1:]) if b - a > 0]
            if between:
                best = nbytes / statistics.mean(between)
        result.append(TensorMetrics(tensor, nbytes, window, nbytes / window if window > 0 else None,
                                    worst, best))
    return result


def _occupancy(out: Analysis, ranks: dict[int, Rank], bins: int) -> None:
    """Per class, mean number of frames on the wire (all ranks) per time bin of the median round."""
    rounds = sorted(out.rounds, key=lambda r: r.T)
    if not rounds:
        return
    chosen = rounds[len(rounds) // 2]
    lo, hi = chosen.start, chosen.start + chosen.T
    width = (hi - lo) / bins
    out.occupancy_round = chosen.T
    for rank in ranks.values():
        for t in rank.transfers:
            if t.direction != "send" or t.start is None or t.end <= lo or t.start >= hi:
                continue
            row = out.occupancy.setdefault(t.cls, [0.0] * bins)
            first, last = int((max(t.start, lo) - lo) / width), int((min(t.end, hi) - lo) / width)
            for b in range(first, min(last, bins - 1) + 1):
                b_lo, b_hi = lo + b * width, lo + (b + 1) * width
                row[b] += max(0.0, min(t.end, b_hi) - max(t.start, b_lo)) / width


def summary(analysis: Analysis, label: str = "") -> str:
    """A text report: per-round means, per-tensor extremes, per-class waits."""
    lines = [f"== {label}" if label else "== timeline analysis"]
    rounds = analysis.rounds
    if not rounds:
        return lines[0] + "\nno complete iteration found (need forward/backward spans on a worker)"

    def mean(attr):
        return statistics.mean(getattr(r, attr) for r in rounds)
    lines.append(f"{len(rounds)} iterations over {len({r.worker for r in rounds})} workers")
    lines.append(f"iteration T {1e3 * mean('T'):.1f} ms, compute C {1e3 * mean('C'):.1f} ms, "
                 f"communication N {1e3 * mean('N'):.1f} ms")
    lines.append(f"feed-forward {1e3 * mean('feed_forward'):.1f} ms, negotiation/idle delay "
                 f"{1e3 * mean('idle'):.1f} ms (max {1e3 * max(r.idle for r in rounds):.1f})")
    lines.append(f"rho {mean('rho'):.3f}, alpha {mean('alpha'):.3f}, U = C/T {mean('U'):.3f} "
                 f"(Caramel's formula {mean('U_formula'):.3f})")
    if analysis.tensors:
        windows = [t.bp_window for t in analysis.tensors]
        lines.append(f"back-propagation window per tensor: mean {1e3 * statistics.mean(windows):.1f} ms, "
                     f"max {1e3 * max(windows):.1f} ms, min {1e3 * min(windows):.1f} ms")
        for name, attr in (("reaction", "reaction_bw"), ("immutable worst-case", "immutable_worst_bw"),
                           ("immutable best-case", "immutable_best_bw")):
            values = [getattr(t, attr) for t in analysis.tensors if getattr(t, attr)]
            if values:
                lines.append(f"{name} bandwidth: max {max(values) / 1e6:.2f} MB/s over tensors")
    for cls in sorted(analysis.waits):
        waits = sorted(analysis.waits[cls])
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))]
        lines.append(f"class {cls}: {len(waits)} frames, queue+wire median "
                     f"{1e3 * statistics.median(waits):.2f} ms, p95 {1e3 * p95:.2f} ms")
    return "\n".join(lines)
