"""The arithmetic of `geryon bench paper`: the paper's figures, the scaling, the calibration, the rows.

Pure functions and constants, no processes or sockets, so every number the bench prints can be
checked by a unit test.

Scaling. The paper's cluster (8 hosts, 10 or 40 Gbit/s each, a GPU per worker) becomes replayed
workers on an emulated cluster with three numbers:
  compute_scale k  paper compute time = k x the profile's per-layer GPU time. The paper does not
                   name its GPU or batch size, so k is calibrated ONCE, on VGG-19 vanilla at 10GbE
                   (`calibration_step`), and reused for every other cell;
  size_scale s     every tensor has s x the profiled bytes;
  wall_scale w     one paper second lasts w seconds here.
The replay runs each layer for k x w x its profiled time and every port runs at bw x s / w, so
each transfer takes w x its time at bw with full sizes: transfer time / compute time is the paper
setting's. With w = 1 (the default) an emulated iteration lasts as long as the paper's would.

Scaling efficiency = per-worker images/s in the distributed run / one worker's compute-only
images/s = compute_s / iteration_s (the batch cancels), where compute_s is one replayed worker's
iteration with no transport at all, measured in the same run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple

from geryon.errors import ConfigError
from geryon.sim.paper import LINKS, paper_efficiency

# the less urgent class's transport threads run this much nicer in bench paper: the control row's
# iteration-boundary chain waited for CPU behind the FC parameters' threads (docs/paper-table.md)
CLASS_THREAD_NICE = 10
# ... or, where allowed, every flow's threads run real-time (SCHED_RR), class c at this priority - c: 16
# role processes share the machine's few cores, where a real host's transport has cores of its own
# (docs/paper-table.md); the same for every policy (a single-flow policy's threads all get the top one)
THREAD_RT_PRIORITY = 2
# the workers' replayed compute stands for a GPU, which a real host's transport threads never slow
# down: where allowed it runs SCHED_RR at this priority, above every transport thread
# (docs/paper-table.md: with the bulk class real-time, the compute threads waited behind it)
COMPUTE_RT_PRIORITY = THREAD_RT_PRIORITY + 1

# The paper's figures themselves (efficiencies, slicing table, calibration cell) are geryon.sim.paper's.
MODELS = ("vgg19", "resnet50", "alexnet", "inceptionv3")
CONTROL = "control-nolimit"
BYTES_PER_PARAMETER = 4


@dataclass(frozen=True)
class PaperScale:
    """How paper time and bytes map onto the emulation (see the module docstring)."""

    compute_scale: float
    size_scale: float = 0.01
    wall_scale: float = 1.0

    def __post_init__(self):
        if self.compute_scale <= 0 or self.wall_scale <= 0 or not 0 < self.size_scale <= 1:
            raise ConfigError("need compute_scale > 0, wall_scale > 0 and 0 < size_scale <= 1")

    @property
    def replay_time_scale(self) -> float:
        """What the replay multiplies each profiled layer time by."""
        return self.compute_scale * self.wall_scale

    def link_rate(self, bandwidth_bits: float) -> int:
        """Bits/s of an emulated port standing for a `bandwidth_bits` port of the paper's cluster."""
        return int(round(bandwidth_bits * self.size_scale / self.wall_scale))

    def slice_bytes(self, params_per_slice: int) -> int:
        """Emulated bytes of a slice of `params_per_slice` float32 parameters (at least 1 KiB)."""
        return max(1024, int(round(params_per_slice * BYTES_PER_PARAMETER * self.size_scale)))

    def describe(self, bandwidth_bits: float) -> str:
        return (f"{bandwidth_bits / 1e9:g} Gbit/s with full-size tensors = {self.link_rate(bandwidth_bits) / 1e6:g} "
                f"Mbit/s ports with tensors x {self.size_scale:g}, compute x {self.compute_scale:.3g} "
                f"(calibrated) x {self.wall_scale:g} (wall): same transfer/compute ratio")


def calibration_step(compute_scale: float, compute_s: float, iteration_s: float, target: float) -> float:
    """The next compute scale toward scaling efficiency `target`, from one measurement.

    At `compute_scale` one worker's compute took `compute_s` and a distributed iteration
    `iteration_s`. Taking the non-overlapped communication N = iteration_s - compute_s as fixed,
    efficiency C / (C + N) = target needs C = target x N / (1 - target): the compute scale grows by
    that factor over the measured C. (N shrinks a little as compute grows and hides more transfer,
    so two or three steps converge.)
    """
    if not 0 < target < 1:
        raise ConfigError(f"target efficiency must lie in (0, 1), got {target}")
    if compute_s <= 0 or iteration_s <= 0:
        raise ConfigError("compute and iteration times must be positive")
    exposed = iteration_s - compute_s
    if exposed <= 0:   # compute-bound already: more compute cannot lower the efficiency
        return compute_scale * 0.5
    wanted = target * exposed / (1.0 - target)
    return compute_scale * wanted / compute_s


def scaling_efficiency(compute_s: float, iteration_s: float) -> float:
    """Per-worker images/s distributed / compute-only images/s (the batch cancels)."""
    if iteration_s <= 0:
        raise ConfigError("iteration time must be positive")
    return compute_s / iteration_s


def summarize(times: list[float]) -> dict:
    """Median, spread (interquartile range) and extremes of measured iteration times."""
    if not times:
        raise ConfigError("no measured iterations")
    ordered = sorted(times)
    if len(ordered) >= 4:
        quartiles = statistics.quantiles(ordered, n=4, method="inclusive")
        spread = quartiles[2] - quartiles[0]
    else:
        spread = ordered[-1] - ordered[0]
    return {"median": statistics.median(ordered), "spread": spread, "min": ordered[0],
            "max": ordered[-1], "count": len(ordered)}


def rotated(items, repetition: int) -> list:
    """`items` started at position repetition mod len: each policy runs first once per cycle."""
    items = list(items)
    if not items:
        return items
    shift = repetition % len(items)
    return items[shift:] + items[:shift]


def slowest_per_iteration(worker_steps: list[list[float]]) -> list[float]:
    """Per iteration, the slowest worker's seconds (the synchronous job moves at its pace)."""
    return [max(column) for column in zip(*worker_steps)]


def make_row(*, model: str, link: str, policy: str, workers: int, layout: str, congestion: str,
             times: list[float], compute_s: float, batch: int, scale: PaperScale,
             vanilla_s: float | None, extra: dict | None = None) -> dict:
    """One result row: the iteration statistics, images/s, speedup, efficiency, paper figure, error."""
    stats = summarize(times)
    iteration = stats["median"]
    efficiency = scaling_efficiency(compute_s, iteration)
    paper = paper_efficiency(model, link, policy)
    bandwidth = None if policy == CONTROL else LINKS[link]
    row = {
        "model": model, "link": link, "policy": policy, "workers": workers, "layout": layout,
        "congestion": congestion,
        "iteration_s": iteration, "iteration_spread": stats["spread"],
        "iteration_min": stats["min"], "iteration_max": stats["max"], "iterations": stats["count"],
        "images_per_s": workers * batch / iteration,
        "speedup_vs_vanilla": (vanilla_s / iteration) if vanilla_s else None,
        "scaling_efficiency": efficiency,
        "paper_scaling_efficiency": paper,
        "error_points": None if paper is None else 100.0 * (efficiency - paper),
        "compute_s": compute_s, "batch": batch,
        "time_scale": scale.compute_scale, "wall_scale": scale.wall_scale,
        "replay_time_scale": scale.replay_time_scale, "size_scale": scale.size_scale,
        "bw_bits": bandwidth,
        "link_rate_bits": None if bandwidth is None else scale.link_rate(bandwidth),
        "times": times,
    }
    if extra:
        row.update(extra)
    return row


class ProcStat(NamedTuple):
    """All cores' jiffies since boot, from /proc/stat's first line."""
    busy: float     # user, nice, system, irq, softirq: work this machine did
    total: float    # busy + idle + iowait + steal
    steal: float    # time the vCPUs were ready to run and the hypervisor ran another guest


def cpu_share(before: ProcStat, after: ProcStat, field: str = "busy") -> float | None:
    """Fraction of all cores' time between two /proc/stat readings that went to `field`: "busy" (this
    machine's work; steal counts in the total, not as busy) or "steal" (the hypervisor running other
    guests). None when no time passed."""
    total = after.total - before.total
    return None if total <= 0 else (getattr(after, field) - getattr(before, field)) / total


def read_proc_stat(path: str = "/proc/stat") -> ProcStat:
    """All cores' busy, total and steal jiffies since boot. On a virtual machine steal is nobody's work
    here, so it is kept out of `busy`: a busy figure with steal in it rises when a neighbouring guest
    gets busy."""
    with open(path) as handle:
        fields = [float(x) for x in handle.readline().split()[1:]] + [0.0] * 8
    idle, steal = fields[3] + fields[4], fields[7]
    total = sum(fields[:8])
    return ProcStat(total - idle - steal, total, steal)
