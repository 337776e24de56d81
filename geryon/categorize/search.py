"""Threshold search during training: try candidates for a few iterations each, fit, keep the best.

Use inside a training loop (every rank runs the same loop):

    search = ThresholdSearch(SearchSettings(), reducer=TorchDistributedReducer())
    for iteration in itertools.count():
        thresholds = search.thresholds_for(iteration)    # constant within an iteration
        ... apply threshold_split(ranking, thresholds) if it changed, then run the iteration ...
        search.record(iteration, seconds)                # collective at the end of each probe
    search.chosen, search.to_record()                    # what is kept, the RUN.json data

Points: with K classes (`classes`, default 2) a point is K−1 strictly increasing candidate
thresholds (default grid 0, 0.05, ..., 1); two classes have 1-tuples and `threshold_for` /
`chosen` give the float.

Plan, `budget` probes in all (default 10 for two classes, 6 more per further class):
1. round one: `first_round` spread-out points (two classes: evenly spaced incl. 0 and 1; K classes:
   every increasing tuple of a few evenly spaced interior levels, 0.2/0.4/0.6/0.8 pairwise for K = 3);
2. refining: the untried point the model favours -- `method="fit"` (default for two classes): the
   grid point closest to the robust spline's minimum (`fit.py`); `method="gp"` (default for more):
   the lowest mean − kappa·sd of a Gaussian process (`surrogate.py`);
3. the last `confirm` probes (default 2) re-measure the two best points so far, alternating, and the
   choice is the better of those two by the model refitted on every sample: one lucky probe (next to
   a cliff, say) can no longer win alone. Three classes: RUN.json gets the GP's mean over every
   (t1, t2) pair (`surface`) for the report's heat-map.
A probe runs `iters_per_probe` iterations; the first `warmup` are discarded (queues and windows
settle after a switch); `fastest` < 1 keeps only that share of a probe's fastest kept iterations
(interference only ever adds time). At the end of each probe every rank hands its times to the
reducer; rank 0 takes, per iteration, the max over ranks (a synchronous iteration is as slow as its
slowest rank), fits and decides the next probe; every rank receives the same decision. The
thresholds change only between iterations: `thresholds_for(i)` is fixed before iteration i starts,
so a gradient is pushed and applied under exactly one assignment and no update is lost or applied
twice; what the transport does at the switch is its business, it just sees a new assignment at an
iteration boundary.

Why these defaults: docs/threshold-search.md has the measurements (analytic model over hundreds of
seeds, `python -m geryon.bench.search_methods`, and the emulated cluster). In short: the curves are
flat near their best with a cliff next to it; at 2% iteration noise every method lands within 3%
of the best; at 5% or with load bursts a few runs in a hundred miss, the GP no better than the
spline on one threshold; re-measuring the best two removes the cliff-edge misses. Earlier
measurements of the spline's settings (60 seeds per case, VGG-19 at 40 and 10 Gbit/s, ResNet-50 at 10
and 5, Inception-v3 at 5, AlexNet at 10): first round 6 of 10 (7 leaves too few refining probes,
30% misses for ResNet-50 at 5 Gbit/s); smoothing 0.25 (0.5 smooths away ResNet-50's narrow dip);
8 instead of 5 iterations per probe on noisy clusters (misses at 5% noise 6.7% -> 5.0%).
"""

import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from geryon.categorize.fit import DEFAULT_SMOOTHING, ThresholdFit, fit_threshold_curve
from geryon.categorize.reduce import LocalReducer
from geryon.categorize.runrecord import SCHEMA
from geryon.errors import ConfigError

METHODS = ("gp", "fit")
Point = tuple[float, ...]


def default_candidates() -> tuple[float, ...]:
    return tuple(round(i * 0.05, 10) for i in range(21))


def default_budget(classes: int) -> int:
    """10 probes for two classes (the public fork's); 6 more per further threshold."""
    return 10 + 6 * (classes - 2)


@dataclass(frozen=True)
class SearchSettings:
    """What to try and for how long (plain data; stored in RUN.json)."""

    candidates: tuple[float, ...] = field(default_factory=default_candidates)
    budget: int | None = None   # probes in all (None: default_budget(classes))
    first_round: int = 6        # spread-out probes before refining
    iters_per_probe: int = 5
    warmup: int = 1             # iterations discarded at the start of every probe
    smoothing: float = DEFAULT_SMOOTHING
    start_iteration: int = 0    # the first iteration the search owns
    classes: int = 2            # K: the search chooses K−1 thresholds
    method: str | None = None   # "fit" (robust spline; two classes) or "gp" (Gaussian process);
                                # None: fit for two classes, gp for more
    confirm: int = 2            # last probes: re-measure the two best points, alternating
    kappa: float = 1.0          # gp: next point minimises mean − kappa · sd
    fastest: float = 1.0        # share of each probe's kept iterations the model sees: the fastest ones

    def __post_init__(self):
        values = [float(t) for t in self.candidates]
        if not values:
            raise ConfigError("the search needs at least one candidate threshold")
        if any(not 0.0 <= t <= 1.0 for t in values):
            raise ConfigError(f"candidate thresholds must lie in [0, 1], got {values}")
        if sorted(set(values)) != values:
            raise ConfigError("candidate thresholds must be strictly increasing")
        object.__setattr__(self, "candidates", tuple(values))
        if self.classes < 2:
            raise ConfigError(f"a threshold search needs at least 2 classes, got {self.classes}")
        if len(values) < self.classes - 1:
            raise ConfigError(f"{self.classes} classes need at least {self.classes - 1} candidate thresholds")
        if self.method is None:
            object.__setattr__(self, "method", "fit" if self.classes == 2 else "gp")
        if self.method not in METHODS:
            raise ConfigError(f"unknown search method {self.method!r}; use one of {', '.join(METHODS)}")
        if self.method == "fit" and self.classes != 2:
            raise ConfigError("the robust-fit method searches one threshold; use method gp for 3+ classes")
        if self.budget is None:
            object.__setattr__(self, "budget", default_budget(self.classes))
        if self.budget < 1 or self.first_round < 1 or self.confirm < 0:
            raise ConfigError("budget and first_round must be at least 1, confirm at least 0")
        if not 0 < self.fastest <= 1:
            raise ConfigError(f"fastest must be in (0, 1], got {self.fastest}")
        if self.iters_per_probe < 1 or not 0 <= self.warmup < self.iters_per_probe:
            raise ConfigError(f"need 0 <= warmup ({self.warmup}) < iters_per_probe ({self.iters_per_probe})")

    @property
    def dimensions(self) -> int:
        return self.classes - 1

    def points(self) -> list[Point]:
        """Every candidate point: K−1 strictly increasing candidate thresholds."""
        return list(itertools.combinations(self.candidates, self.dimensions))

    def first_round_candidates(self) -> list[Point]:
        count = min(self.first_round, self.budget, len(self.points()))
        last = len(self.candidates) - 1
        if self.dimensions == 1:
            picks = sorted({round(i * last / (count - 1)) if count > 1 else last // 2 for i in range(count)})
            return [(self.candidates[i],) for i in picks]
        # K−1 thresholds: every increasing tuple of a few evenly spaced interior levels (K = 3, six
        # probes: 0.2, 0.4, 0.6, 0.8 pairwise), thinned evenly if there are more than `count`.
        levels = self.dimensions + 1
        while math.comb(levels + 1, self.dimensions) <= count and levels + 1 <= last - 1:
            levels += 1
        indices = sorted({round((i + 1) * last / (levels + 1)) for i in range(levels)})
        design = list(itertools.combinations([self.candidates[i] for i in indices], self.dimensions))
        if len(design) > count:
            design = [design[round(i * (len(design) - 1) / (count - 1))] for i in range(count)] if count > 1 \
                else design[len(design) // 2:len(design) // 2 + 1]
        return design

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
        self.probes: list[dict] = []        # rank 0: full records; other ranks: thresholds and times
        self.fit: ThresholdFit | None = None   # two classes: the fitted curve over tried thresholds
        self.model: dict | None = None      # the last decision's model data (either method)
        self.surface: dict | None = None    # 3+ classes: the surrogate's mean over the candidate grid
        self.chosen_point: Point | None = None
        self._plan = self.settings.first_round_candidates()
        self._confirm_plan: list[Point] = []
        self._confirming = False
        self._round = 1                     # rank 0: the round of the probe now running
        self._current: Point = self._plan[0]
        self._probe_start = self.settings.start_iteration
        self._local_times: list[float] = []
        self._samples: dict[Point, list[float]] = {}
        self._next_iteration = self.settings.start_iteration

    @property
    def done(self) -> bool:
        return self.chosen_point is not None

    @property
    def chosen(self):
        """The chosen threshold (two classes) or list of K−1 thresholds; None until done."""
        if self.chosen_point is None:
            return None
        return self.chosen_point[0] if self.settings.dimensions == 1 else list(self.chosen_point)

    def thresholds_for(self, iteration: int) -> Point:
        """The K−1 thresholds to train iteration `iteration` with (the chosen ones once done)."""
        if self.done:
            return self.chosen_point
        if iteration > self._probe_start + self.settings.iters_per_probe - 1:
            raise ConfigError(f"iteration {iteration} is past the current probe; record() the iterations "
                              f"before it first")
        return self._current

    def threshold_for(self, iteration: int) -> float:
        """Two classes: the threshold to train iteration `iteration` with."""
        if self.settings.dimensions != 1:
            raise ConfigError(f"a {self.settings.classes}-class search has {self.settings.dimensions} "
                              "thresholds; use thresholds_for()")
        return self.thresholds_for(iteration)[0]

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

    def run(self, measure_iteration, max_iterations: int | None = None):
        """Drive the search alone: `measure_iteration(threshold) -> seconds` for one iteration.

        Two classes: measure_iteration gets a float; more: a tuple of K−1 thresholds.
        """
        iteration = self._next_iteration
        limit = max_iterations or self.settings.budget * self.settings.iters_per_probe
        while not self.done and iteration < self.settings.start_iteration + limit:
            point = self.thresholds_for(iteration)
            self.record(iteration, measure_iteration(point[0] if self.settings.dimensions == 1 else point))
            iteration += 1
        return self.chosen

    # -- rank 0 only -------------------------------------------------------------------------------
    def _decide(self, all_times: list[list[float]]) -> dict:
        settings = self.settings
        per_iteration = [max(times[i] for times in all_times) for i in range(settings.iters_per_probe)]
        kept = per_iteration[settings.warmup:]
        used = sorted(kept)[:max(1, round(settings.fastest * len(kept)))]
        self._samples.setdefault(self._current, []).extend(used)
        spent = len(self.probes)
        refining_until = max(len(self._plan), settings.budget - settings.confirm)
        probe = {"index": spent, "round": self._round, "thresholds": list(self._current),
                 "first_iteration": self._probe_start, "times": [list(times) for times in all_times],
                 "reduced": per_iteration, "kept": kept, "median_s": float(np.median(kept))}
        if settings.dimensions == 1:
            probe["threshold"] = self._current[0]
        self.probes.append(probe)
        spent += 1
        model = self._fit_model()
        decision = {"model": model["data"], "fit": model["fit"]}
        if spent < len(self._plan):
            return {**decision, "next": list(self._plan[spent])}
        if spent >= settings.budget:
            return {**decision, **self._final(model)}
        if spent < refining_until and not self._confirming:
            following = self._refine(model)
            if following is not None:
                self._round = 2
                return {**decision, "next": list(following)}
        if not self._confirming:
            # Re-measure the two best so far, alternating, so that the final choice between them rests on
            # fresh samples taken close together in time (drift on a shared machine cancels out).
            self._confirming = True
            top = [point for point, _value in model["ranked"][:2]]
            self._confirm_plan = [top[i % len(top)] for i in range(min(settings.confirm, settings.budget - spent))]
        if self._confirm_plan:
            self._round = 3
            return {**decision, "next": list(self._confirm_plan.pop(0))}
        return {**decision, **self._final(model)}

    def _fit_model(self) -> dict:
        """The current model: ranked tried points, its record data and (two classes) a ThresholdFit."""
        if self.settings.method == "fit":
            fit = fit_threshold_curve({p[0]: ys for p, ys in self._samples.items()}, self.settings.smoothing)
            ranked = sorted((((t,), v) for t, v in zip(fit.nodes, fit.values)), key=lambda item: (item[1], item[0]))
            return {"ranked": ranked, "fit": fit.to_data(), "data": fit.to_data(), "fit_object": fit}
        from geryon.categorize.surrogate import METHOD, fit_surrogate

        surrogate = fit_surrogate(self._samples)
        ranked = surrogate.ranked_tried()
        fit = None
        if self.settings.dimensions == 1:
            mean, _sd = surrogate.predict(surrogate.points)
            best = int(np.argmin(mean))
            fit = ThresholdFit(nodes=tuple(p[0] for p in surrogate.points), values=tuple(float(m) for m in mean),
                               medians=tuple(surrogate.medians), noise_scale=surrogate.spread, smoothing=0.0,
                               minimum=surrogate.points[best][0], minimum_s=float(mean[best]),
                               method=METHOD).to_data()
        return {"ranked": ranked, "fit": fit, "data": surrogate.to_data(), "surrogate": surrogate}

    def _refine(self, model: dict) -> Point | None:
        """The next point to probe in the refining round, or None when every point was tried."""
        untried = [p for p in self.settings.points() if p not in self._samples]
        if not untried:
            return None
        if self.settings.method == "fit":
            minimum = model["fit_object"].minimum
            return min(untried, key=lambda p: (abs(p[0] - minimum), p))
        mean, sd = model["surrogate"].predict(untried)
        score = mean - self.settings.kappa * sd
        return untried[int(np.argmin(score))]

    def _final(self, model: dict) -> dict:
        """The choice: the best tried point by the model (among the re-measured pair, if any)."""
        ranked = model["ranked"]
        confirmed = {tuple(p["thresholds"]) for p in self.probes if p["round"] == 3}
        if confirmed:
            ranked = [item for item in ranked if item[0] in confirmed] or ranked
        chosen, value = ranked[0]
        decision = {"next": None, "chosen": list(chosen), "chosen_s": value}
        if self.settings.dimensions == 2 and "surrogate" in model:
            decision["surface"] = surface_of(model["surrogate"], self.settings)
        return decision

    # -- every rank --------------------------------------------------------------------------------
    def _apply(self, decision: dict) -> None:
        if self.reducer.rank != 0:
            probe = {"index": len(self.probes), "thresholds": list(self._current),
                     "first_iteration": self._probe_start, "times": [list(self._local_times)]}
            if self.settings.dimensions == 1:
                probe["threshold"] = self._current[0]
            self.probes.append(probe)
        self.fit = ThresholdFit.from_data(decision["fit"]) if decision.get("fit") else None
        self.model = decision.get("model")
        self._local_times = []
        self._probe_start = self._next_iteration
        if decision.get("next") is None:
            self.surface = decision.get("surface")
            self._chosen_s = decision.get("chosen_s")
            self.chosen_point = tuple(float(t) for t in decision["chosen"])
        else:
            self._current = tuple(float(t) for t in decision["next"])

    def to_record(self, sweep: list[dict] | None = None, extra: dict | None = None) -> dict:
        """The RUN.json data (schema in `runrecord.py`); complete on rank 0."""
        return {"schema": SCHEMA, "context": {**self.context, "classes": self.settings.classes},
                "settings": self.settings.to_data(),
                "world_size": self.reducer.world_size, "probes": self.probes,
                "fit": self.fit.to_data() if self.fit else None, "model": self.model,
                "surface": self.surface, "chosen": self.chosen,
                "chosen_thresholds": list(self.chosen_point) if self.chosen_point else None,
                "chosen_fitted_s": getattr(self, "_chosen_s", None),
                "sweep": sweep, "extra": dict(extra or {})}


def surface_of(surrogate, settings: SearchSettings) -> dict:
    """Three classes: the surrogate's mean (and sd) over every (t1, t2) candidate pair, for a heat-map."""
    axis = list(settings.candidates)
    points = settings.points()
    mean, sd = surrogate.predict(points)
    grid = [[None] * len(axis) for _ in axis]
    grid_sd = [[None] * len(axis) for _ in axis]
    index = {t: i for i, t in enumerate(axis)}
    for (t1, t2), m, s in zip(points, mean, sd):
        grid[index[t1]][index[t2]] = float(m)
        grid_sd[index[t1]][index[t2]] = float(s)
    return {"axis": axis, "mean_s": grid, "sd_s": grid_sd}
