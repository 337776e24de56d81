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

import numpy as np

from geryon.categorize.model import IterationModel
from geryon.categorize.profiles import LayerProfile
from geryon.categorize.search import SearchSettings, ThresholdSearch


def analytic_measure(profile: LayerProfile, bandwidth: float, metric: str = "position",
                     noise: float = 0.02, outlier_rate: float = 0.05, seed: int = 0):
    """(measure_iteration, true_iter_s) for `profile` on the analytic model with noise added."""
    model = IterationModel.from_profile(profile, bandwidth)
    exact = model.threshold_measure(profile.ranking(), metric)
    cache: dict[float, float] = {}
    rng = np.random.default_rng(seed)

    def true_iter_s(threshold: float) -> float:
        if threshold not in cache:
            cache[threshold] = exact(threshold)
        return cache[threshold]

    def measure_iteration(threshold: float) -> float:
        value = true_iter_s(threshold) * float(rng.lognormal(0.0, noise)) if noise else true_iter_s(threshold)
        if outlier_rate and rng.random() < outlier_rate:
            value *= 3.0  # a GC pause, a retransmission timeout
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


def run_threshold_bench(measure_iteration, settings: SearchSettings | None = None, context: dict | None = None,
                        sweep: bool = True, true_iter_s=None) -> dict:
    """Search, then sweep every candidate, then re-measure the chosen one; return the RUN.json record."""
    settings = settings or SearchSettings()
    search = ThresholdSearch(settings, context=context)
    search.run(measure_iteration)
    kept_slice = slice(settings.warmup, settings.iters_per_probe)

    def probe(threshold):
        times = [measure_iteration(threshold) for _ in range(settings.iters_per_probe)]
        return times, float(np.median(times[kept_slice]))

    sweep_points = None
    extra = {"chosen": search.chosen, "probes": len(search.probes)}
    if sweep:
        sweep_points = []
        for threshold in settings.candidates:
            times, median = probe(threshold)
            sweep_points.append({"threshold": threshold, "iter_s": median, "times": times})
        best = min(sweep_points, key=lambda p: (p["iter_s"], p["threshold"]))
        extra.update(sweep_best=best["threshold"], sweep_best_iter_s=best["iter_s"])
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
