"""Threshold search during training: try candidates for a few iterations each, fit, keep the best.

Use inside a training loop (every rank runs the same loop):

    search = ThresholdSearch(SearchSettings(), reducer=TorchDistributedReducer())
    for iteration in itertools.count():
        threshold = search.threshold_for(iteration)      # constant within an iteration
        ... apply threshold_split(ranking, [threshold]) if it changed, then run the iteration ...
        search.record(iteration, seconds)                # collective at the end of each probe
    search.chosen, search.to_record()                    # the threshold kept, the RUN.json data

Plan: candidates are a grid of thresholds (default 0, 0.05, ..., 1). Round one probes
`first_round` of them evenly spaced; then, until `budget` probes are spent, each next probe is the
untried grid point closest to the current fitted minimum (a finer second round, adaptive). A probe
runs `iters_per_probe` iterations; the first `warmup` are discarded (queues and windows settle after
a switch). At the end of each probe every rank hands its times to the reducer; rank 0 takes, per
iteration, the max over ranks (a synchronous iteration is as slow as its slowest rank), fits
(`fit.py`: robust edge-preserving smoothing spline, soft_l1) and decides the next probe; every rank
receives the same decision. The threshold changes only between iterations: `threshold_for(i)` for
an iteration is fixed before it starts, so a gradient is pushed and applied under exactly one
assignment and no update is lost or applied twice; what the transport does at the switch is its
business, it just sees a new assignment at an iteration boundary.

Defaults, from measurements on the analytic model (`model.py`; `geryon bench threshold` reproduces
one run): VGG-19 at 40 and 10 Gbit/s, ResNet-50 at 10 and 5 Gbit/s, Inception-v3 at 5 Gbit/s,
AlexNet at 10 Gbit/s; every iteration time multiplied by lognormal noise (sigma 2% or 5%) and 5% of
iterations made 3x slower; 60 seeds per case; error = noise-free time at the chosen threshold over
the best of the 21 candidates.
- budget 10, first round 6, 5 iterations per probe, 1 warm-up (the public fork's 10 probes of
  5 steps), grid step 0.05, smoothing 0.25: at 2% noise mean error 0.2-0.6% per case, worst
  2.8%, no run beyond 3%; at 5% noise mean 0.3-1.8%, 9% of runs beyond 3% (22% for ResNet-50 at
  5 Gbit/s and Inception-v3, whose curves are saw-toothed). Noisier clusters want more iterations
  per probe: 8 instead of 5 took the misses at 5% noise from 6.7% to 5.0% (30 seeds).
- first round 5 / 6 / 7 of 10: 5 and 6 are close (at 5% noise 6.1% vs 6.7% of runs beyond 3%,
  both none at 2%); 7 leaves too few refining probes (30% of ResNet-50 at 5 Gbit/s runs beyond
  3% at 2% noise). 6 keeps round one dense enough to see a cliff like VGG-19's.
- smoothing 0 / 0.1 / 0.25 / 0.5: 0.25 had no run beyond 3% at 2% noise, 0.5 had 2% of runs
  for ResNet-50 at 5 Gbit/s (it smooths away a narrow dip).
"""

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from geryon.categorize.fit import DEFAULT_SMOOTHING, ThresholdFit, fit_threshold_curve
from geryon.categorize.reduce import LocalReducer
from geryon.categorize.runrecord import SCHEMA
from geryon.errors import ConfigError


def default_candidates() -> tuple[float, ...]:
    return tuple(round(i * 0.05, 10) for i in range(21))


@dataclass(frozen=True)
class SearchSettings:
    """What to try and for how long (plain data; stored in RUN.json)."""

    candidates: tuple[float, ...] = field(default_factory=default_candidates)
    budget: int = 10            # probes in all, both rounds
    first_round: int = 6        # evenly spaced probes before refining
    iters_per_probe: int = 5
    warmup: int = 1             # iterations discarded at the start of every probe
    smoothing: float = DEFAULT_SMOOTHING
    start_iteration: int = 0    # the first iteration the search owns

    def __post_init__(self):
        values = [float(t) for t in self.candidates]
        if not values:
            raise ConfigError("the search needs at least one candidate threshold")
        if any(not 0.0 <= t <= 1.0 for t in values):
            raise ConfigError(f"candidate thresholds must lie in [0, 1], got {values}")
        if sorted(set(values)) != values:
            raise ConfigError("candidate thresholds must be strictly increasing")
        object.__setattr__(self, "candidates", tuple(values))
        if self.budget < 1 or self.first_round < 1:
            raise ConfigError("budget and first_round must be at least 1")
        if self.iters_per_probe < 1 or not 0 <= self.warmup < self.iters_per_probe:
            raise ConfigError(f"need 0 <= warmup ({self.warmup}) < iters_per_probe ({self.iters_per_probe})")

    def first_round_candidates(self) -> list[float]:
        count = min(self.first_round, self.budget, len(self.candidates))
        last = len(self.candidates) - 1
        picks = sorted({round(i * last / (count - 1)) if count > 1 else last // 2 for i in range(count)})
        return [self.candidates[i] for i in picks]

    def to_data(self) -> dict:
        data = asdict(self)
        data["candidates"] = list(self.candidates)
        return data


class ThresholdSearch:
    """Drives the probes; see the module docstring for the protocol."""

    def __init__(self, settings: SearchSettings | None = None, reducer=None, context: dict | None = None):
        self.settings = settings or SearchSettings()
        self.reducer = reducer or LocalReducer()
        self.context = dict(context or {})  # model, metric, tensors...: copied into RUN.json
        self.probes: list[dict] = []        # rank 0: full records; other ranks: threshold and round
        self.fit: ThresholdFit | None = None
        self.chosen: float | None = None
        self._plan = self.settings.first_round_candidates()
        self._current = self._plan[0]
        self._probe_start = self.settings.start_iteration
        self._local_times: list[float] = []
        self._samples: dict[float, list[float]] = {}
        self._next_iteration = self.settings.start_iteration

    @property
    def done(self) -> bool:
        return self.chosen is not None

    def threshold_for(self, iteration: int) -> float:
        """The threshold to train iteration `iteration` with (the chosen one once done)."""
        if self.done:
            return self.chosen
        if iteration > self._probe_start + self.settings.iters_per_probe - 1:
            raise ConfigError(f"iteration {iteration} is past the current probe; record() the iterations "
                              f"before it first")
        return self._current

    def record(self, iteration: int, seconds: float) -> None:
        """Report how long iteration `iteration` took on this rank; collective at a probe's end."""
        if self.done:
            return
        if iteration != self._next_iteration:
            raise ConfigError(f"expected the time of iteration {self._next_iteration}, got {iteration}")
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ConfigError(f"iteration time must be a finite number of seconds, got {seconds!r}")
        self._local_times.append(float(seconds))
        self._next_iteration += 1
        if len(self._local_times) < self.settings.iters_per_probe:
            return
        decision = self.reducer.decide(self._local_times, self._decide)
        self._apply(decision)

    def run(self, measure_iteration, max_iterations: int | None = None) -> float:
        """Drive the search alone: `measure_iteration(threshold) -> seconds` for one iteration."""
        iteration = self._next_iteration
        limit = max_iterations or self.settings.budget * self.settings.iters_per_probe
        while not self.done and iteration < self.settings.start_iteration + limit:
            self.record(iteration, measure_iteration(self.threshold_for(iteration)))
            iteration += 1
        return self.chosen

    # -- rank 0 only -------------------------------------------------------------------------------
    def _decide(self, all_times: list[list[float]]) -> dict:
        settings = self.settings
        per_iteration = [max(times[i] for times in all_times) for i in range(settings.iters_per_probe)]
        kept = per_iteration[settings.warmup:]
        self._samples.setdefault(self._current, []).extend(kept)
        probe = {"index": len(self.probes), "round": 1 if len(self.probes) < len(self._plan) else 2,
                 "threshold": self._current, "first_iteration": self._probe_start,
                 "times": [list(times) for times in all_times], "reduced": per_iteration,
                 "kept": kept, "median_s": float(np.median(kept))}
        self.probes.append(probe)
        spent = len(self.probes)
        fit = fit_threshold_curve(self._samples, settings.smoothing)
        if spent < len(self._plan):
            return {"next": self._plan[spent], "fit": fit.to_data()}
        untried = [t for t in settings.candidates if t not in self._samples]
        if spent >= settings.budget or not untried:
            return {"next": None, "chosen": fit.minimum, "fit": fit.to_data()}
        nearest = min(untried, key=lambda t: (abs(t - fit.minimum), t))
        return {"next": nearest, "fit": fit.to_data()}

    # -- every rank --------------------------------------------------------------------------------
    def _apply(self, decision: dict) -> None:
        if self.reducer.rank != 0:
            self.probes.append({"index": len(self.probes), "threshold": self._current,
                                "first_iteration": self._probe_start, "times": [list(self._local_times)]})
        self.fit = ThresholdFit.from_data(decision["fit"])
        self._local_times = []
        self._probe_start = self._next_iteration
        if decision.get("next") is None:
            self.chosen = float(decision["chosen"])
        else:
            self._current = float(decision["next"])

    def to_record(self, sweep: list[dict] | None = None, extra: dict | None = None) -> dict:
        """The RUN.json data (schema in `runrecord.py`); complete on rank 0."""
        return {"schema": SCHEMA, "context": self.context, "settings": self.settings.to_data(),
                "world_size": self.reducer.world_size, "probes": self.probes,
                "fit": self.fit.to_data() if self.fit else None, "chosen": self.chosen,
                "chosen_fitted_s": self.fit.minimum_s if self.fit else None,
                "sweep": sweep, "extra": dict(extra or {})}
