"""Threshold benchmark: the search against the exhaustive sweep of the same candidates.

`run_threshold_bench(measure_iteration, ...)` needs only `measure_iteration(threshold) -> seconds`
for one training iteration at that threshold; it runs the search (as training would), then every
candidate for the same number of iterations (the sweep), then the chosen threshold once more, and
returns the RUN.json record with the comparison in `extra`:
`chosen`, `chosen_iter_s`, `sweep_best`, `sweep_best_iter_s`, `probes`, `ratio` (chosen/sweep best).

Backends that provide `measure_iteration`:
- `analytic_measure`: the iteration-time model (geryon.categorize.model) of a profile at a bandwidth, with
  multiplicative lognormal noise and occasional slow iterations (deterministic given a seed);
- `geryon.bench.threshold.run_emulated_threshold_bench`: replayed models (geryon.categorize.replay)
  as parameter-server workers over the real transport on an emulated cluster.
"""

from dataclasses import dataclass

import numpy as np

from geryon.bench.sweep_stats import estimate, interval, ratio_interval
from geryon.categorize.model import IterationModel
from geryon.categorize.profiles import LayerProfile
from geryon.categorize.search import SearchSettings, ThresholdSearch
from geryon.errors import ConfigError


@dataclass(frozen=True)
class SweepRace:
    """The sweep's second stage: `passes` more passes over the contenders only.

    Contenders: the search's choice and the `contenders` candidates with the smallest first-stage
    estimates (fewer where fewer lie within `margin` of the best). The yardstick's precision goes
    where the criterion looks -- at the choice and at what might be the best -- instead of being
    spread over 21 candidates most of which the first passes already put well above the best.
    """

    contenders: int = 4
    passes: int = 8
    margin: float = 0.08
    statistic: str = "trimmed"

    def __post_init__(self):
        if self.contenders < 1 or self.passes < 0 or self.margin < 0:
            raise ConfigError("a sweep race needs contenders >= 1, passes >= 0 and margin >= 0")
        estimate([1.0], self.statistic)   # a known statistic, or ConfigError

    def contenders_of(self, points: list[dict], chosen) -> list[dict]:
        ranked = sorted(points, key=lambda p: (p["iter_s"], p["threshold"]))
        limit = ranked[0]["iter_s"] * (1 + self.margin)
        kept = [p for p in ranked[:self.contenders] if p["iter_s"] <= limit or p is ranked[0]]
        kept += [p for p in points if p["threshold"] == chosen and p not in kept]
        return kept



def analytic_measure(profile: LayerProfile, bandwidth: float, metric: str = "position",
                     noise: float = 0.02, outlier_rate: float = 0.05, seed: int = 0,
                     burst_rate: float = 0.0, burst_length: int = 4, burst_slowdown: float = 0.25):
    """(measure_iteration, true_iter_s) for `profile` on the analytic model with noise added.

    Both take a threshold (two classes) or a tuple of K−1 thresholds. Besides independent noise and
    single slow iterations, `burst_rate` starts (per iteration) a burst of `burst_length` iterations
    each `burst_slowdown` slower: load from other processes on a shared machine, measured on the
    emulated cluster as runs of consecutive slow iterations that a probe's median does not remove.
    """
    model = IterationModel.from_profile(profile, bandwidth)
    exact = model.threshold_measure(profile.ranking(), metric)
    cache: dict[float, float] = {}
    rng = np.random.default_rng(seed)
    burst = {"left": 0}

    def true_iter_s(threshold) -> float:
        key = threshold if isinstance(threshold, (int, float)) else tuple(threshold)
        if key not in cache:
            cache[key] = exact(threshold)
        return cache[key]

    def measure_iteration(threshold: float) -> float:
        value = true_iter_s(threshold) * float(rng.lognormal(0.0, noise)) if noise else true_iter_s(threshold)
        if outlier_rate and rng.random() < outlier_rate:
            value *= 3.0  # a GC pause, a retransmission timeout
        if burst_rate and not burst["left"] and rng.random() < burst_rate:
            burst["left"] = burst_length
        if burst["left"]:
            burst["left"] -= 1
            value *= 1.0 + burst_slowdown
        return value

    return measure_iteration, true_iter_s


def profile_context(profile: LayerProfile, metric: str = "position", **extra) -> dict:
    """The RUN.json `context` for a profile-based run."""
    tensors = [{"name": p.name, "layer": p.layer, "type": p.module_type, "bytes": p.bytes}
               for p in profile.ranking()]
    context = {"model": profile.model, "batch": profile.batch, "derived": profile.derived,
               "metric": metric, "classes": 2, "tensors": tensors}
    context.update(extra)
    return context


def coarse_threshold(profile: LayerProfile, metric: str = "position") -> float:
    """The threshold equal to the coarse CONV/FC split (`classes.coarse_split`) of `profile`."""
    from geryon.categorize.classes import coarse_split, positions

    ranking = profile.ranking()
    assignment = coarse_split(ranking)
    first_low = next((i for i, c in enumerate(assignment.class_of) if c == 1), len(ranking))
    return positions(ranking, metric)[first_low] if first_low < len(ranking) else 1.0


def run_threshold_bench(measure_iteration, settings: SearchSettings | None = None, context: dict | None = None,
                        sweep: bool = True, true_iter_s=None, sweep_passes: int = 1, seed: int = 0,
                        references: dict | None = None, race: "SweepRace | None" = None) -> dict:
    """Search, then sweep every candidate, then re-measure the chosen one; return the RUN.json record.

    The sweep runs `sweep_passes` passes over the candidates, each pass in a fresh random order
    (seeded), and a candidate's time is the median of its kept iterations over all passes: a burst of
    load from elsewhere on the machine then hits different candidates in different passes instead of
    one candidate's whole measurement, and the sweep best is less often a lucky single median.
    `references` ({name: threshold}, e.g. the coarse CONV/FC split) are measured in every pass too
    and reported as `extra[name + "_iter_s"]`. Two classes only (a K-class search has no sweep here).

    `race` (a `SweepRace`) then spends more passes on the contenders only -- the candidates the
    first passes put nearest the best, and the search's choice -- so that the two numbers the
    criterion compares rest on many probes each; its statistic replaces the median, the sweep's best
    is the best contender, and `extra` gets each contender's interval and the sweep ratio's
    (`sweep_ratio_low/high`, `sweep_within_share`: how often a probe-bootstrap of the sweep keeps
    the choice within 3%).
    """
    settings = settings or SearchSettings()
    search = ThresholdSearch(settings, context=context)
    search.run(measure_iteration)
    kept_slice = slice(settings.warmup, settings.iters_per_probe)
    extra = {"chosen": search.chosen, "probes": len(search.probes)}
    if settings.classes != 2:
        if true_iter_s is not None:  # the noise-free model knows every point: no sweep needed
            truths = {p: true_iter_s(p) for p in settings.points()}
            best = min(truths, key=lambda p: (truths[p], p))
            two = {p: v for p, v in truths.items() if p[0] == 0.0 or p[-1] == 1.0}  # a class left empty
            best_two = min(two, key=lambda p: (two[p], p))
            extra.update(true_chosen_iter_s=true_iter_s(search.chosen_point), true_best=list(best),
                         true_best_iter_s=truths[best], true_two_class_best_iter_s=two[best_two],
                         true_ratio=true_iter_s(search.chosen_point) / truths[best])
        return search.to_record(extra=extra)

    def probe(threshold):
        times = [measure_iteration(threshold) for _ in range(settings.iters_per_probe)]
        return times, float(np.median(times[kept_slice]))

    sweep_points = None
    references = dict(references or {})
    if sweep:
        rng = np.random.default_rng(seed)
        points = {t: {"threshold": t, "times": [], "pass_medians": []} for t in settings.candidates}
        named = {name: {"threshold": t, "times": [], "pass_medians": []} for name, t in references.items()}
        jobs = [points[t] for t in settings.candidates] + list(named.values())
        blocks = {id(job): [] for job in jobs}

        def sweep_pass(chosen_jobs):
            for index in rng.permutation(len(chosen_jobs)):
                job = chosen_jobs[index]
                times, median = probe(job["threshold"])
                job["times"].extend(times)
                blocks[id(job)].append(times[kept_slice])
                job["pass_medians"].append(median)

        def kept_of(job):
            return [t for block in blocks[id(job)] for t in block]

        for _pass in range(max(1, sweep_passes)):
            sweep_pass(jobs)
        statistic = race.statistic if race else "median"
        for point in jobs:
            point["iter_s"] = estimate(kept_of(point), statistic)
        sweep_points = [points[t] for t in settings.candidates]
        among = sweep_points
        if race and race.passes > 0:
            among = race.contenders_of(sweep_points, search.chosen)
            for _pass in range(race.passes):
                sweep_pass(among)
            for point in among:
                point["iter_s"] = estimate(kept_of(point), statistic)
                point["interval"] = list(interval(blocks[id(point)], statistic, seed=seed))
                point["contender"] = True
            extra.update(sweep_statistic=statistic, sweep_contenders=[p["threshold"] for p in among],
                         sweep_race_passes=race.passes)
        best = min(among, key=lambda p: (p["iter_s"], p["threshold"]))
        extra.update(sweep_best=best["threshold"], sweep_best_iter_s=best["iter_s"], sweep_passes=sweep_passes)
        if among is not sweep_points:
            overall = min(sweep_points, key=lambda p: (p["iter_s"], p["threshold"]))
            extra.update(sweep_best_any=overall["threshold"], sweep_best_any_iter_s=overall["iter_s"])
        at_chosen = points.get(search.chosen)
        if at_chosen is not None:
            extra.update(chosen_sweep_iter_s=at_chosen["iter_s"], sweep_ratio=at_chosen["iter_s"] / best["iter_s"])
            if among is not sweep_points:
                spread = ratio_interval({p["threshold"]: blocks[id(p)] for p in among}, search.chosen,
                                        [p["threshold"] for p in among], statistic, seed=seed)
                extra.update(sweep_ratio_low=spread["low"], sweep_ratio_high=spread["high"],
                             sweep_within_share=spread["within_share"])
        for name, point in named.items():
            extra[f"{name}_threshold"] = point["threshold"]
            extra[f"{name}_iter_s"] = point["iter_s"]
        if 0.0 in points and 1.0 in points:  # one class either way
            extra["no_priority_iter_s"] = min(points[0.0]["iter_s"], points[1.0]["iter_s"])
    _times, extra["chosen_iter_s"] = probe(search.chosen)
    if sweep:
        extra["ratio"] = extra["chosen_iter_s"] / extra["sweep_best_iter_s"]
    if true_iter_s is not None:
        extra["true_chosen_iter_s"] = true_iter_s(search.chosen)
        truths = {t: true_iter_s(t) for t in settings.candidates}
        extra["true_best"] = min(truths, key=lambda t: (truths[t], t))
        extra["true_best_iter_s"] = truths[extra["true_best"]]
        extra["true_ratio"] = extra["true_chosen_iter_s"] / extra["true_best_iter_s"]
        if sweep_points:
            for point in sweep_points:
                point["true_iter_s"] = truths[point["threshold"]]
    return search.to_record(sweep=sweep_points, extra=extra)
