"""Threshold search: the robust fit, the probe protocol, accuracy against the sweep, every rank agreeing."""

import math
import os

import numpy as np
import pytest

from geryon.bench.sweep import analytic_measure, profile_context, run_threshold_bench
from geryon.categorize.fit import fit_threshold_curve
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.search import SearchSettings, ThresholdSearch
from geryon.errors import ConfigError


def test_fit_ignores_an_outlier_iteration():
    rng = np.random.default_rng(1)
    truth = {t: 0.2 + 0.1 * (t - 0.6) ** 2 for t in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)}
    samples = {t: list(v * rng.lognormal(0, 0.01, 4)) for t, v in truth.items()}
    clean = fit_threshold_curve(samples)
    assert clean.minimum == 0.6
    samples[0.8][0] = 10.0  # one iteration 50x slower (a stall) at a good threshold
    samples[0.6][1] = 5.0
    robust = fit_threshold_curve(samples)
    assert robust.minimum == 0.6
    assert robust.values[4] == pytest.approx(truth[0.8], rel=0.02)
    assert robust.values[3] == pytest.approx(truth[0.6], rel=0.02)


def test_fit_keeps_a_cliff_next_to_the_minimum():
    samples = {0.6: [0.205] * 4, 0.7: [0.202] * 4, 0.8: [0.200] * 4, 0.85: [0.230] * 4, 0.9: [0.242] * 4}
    fit = fit_threshold_curve(samples)
    assert fit.minimum == 0.8 and fit.values[2] == pytest.approx(0.200, rel=0.005)
    assert fit.predict([0.8, 0.85]) == pytest.approx([0.200, 0.230], rel=0.01)


def test_probe_protocol_and_switching_only_between_iterations():
    settings = SearchSettings(candidates=(0.0, 0.25, 0.5, 0.75, 1.0), budget=4, first_round=3,
                              iters_per_probe=3, warmup=1, start_iteration=10, method="fit", confirm=0)
    search = ThresholdSearch(settings)
    seen = []
    iteration = 10
    while not search.done:
        t = search.threshold_for(iteration)
        assert search.threshold_for(iteration) == t  # stable within an iteration
        seen.append(t)
        search.record(iteration, 1.0 + (t - 0.5) ** 2)
        iteration += 1
    assert iteration == 10 + 4 * 3 and len(search.probes) == 4
    assert seen[:9] == [0.0] * 3 + [0.5] * 3 + [1.0] * 3  # round one, evenly spaced
    assert seen[9:] in ([0.25] * 3, [0.75] * 3)            # refining next to the fitted minimum
    assert search.chosen == 0.5 and search.threshold_for(1000) == 0.5
    assert [p["kept"] for p in search.probes][0] == [1.25, 1.25]  # warm-up dropped
    search.record(iteration, 1.0)  # after the search: ignored


def test_protocol_errors():
    search = ThresholdSearch(SearchSettings(iters_per_probe=2, warmup=0))
    with pytest.raises(ConfigError, match="expected the time of iteration 0"):
        search.record(1, 0.1)
    search.record(0, 0.1)
    with pytest.raises(ConfigError, match="expected the time of iteration 1"):
        search.record(0, 0.1)  # twice the same iteration would double count
    with pytest.raises(ConfigError, match="past the current probe"):
        search.threshold_for(5)
    with pytest.raises(ConfigError):
        search.record(1, math.nan)
    for bad in (dict(candidates=(0.5, 1.2)), dict(candidates=(0.5, 0.2)), dict(candidates=()),
                dict(warmup=5, iters_per_probe=5), dict(budget=0)):
        with pytest.raises(ConfigError):
            SearchSettings(**bad)


def test_the_last_probes_re_measure_the_best_two_and_the_choice_is_one_of_them():
    settings = SearchSettings(candidates=tuple(i / 10 for i in range(11)), budget=8, first_round=4,
                              iters_per_probe=3, warmup=1, confirm=2)
    search = ThresholdSearch(settings)
    rng = np.random.default_rng(0)
    search.run(lambda t: (1.0 + (t - 0.62) ** 2) * rng.lognormal(0, 0.01))
    rounds = [p["round"] for p in search.probes]
    assert rounds == [1] * 4 + [2] * 2 + [3] * 2
    confirmed = [p["threshold"] for p in search.probes[-2:]]
    assert len(set(confirmed)) == 2 and all(t in [p["threshold"] for p in search.probes[:-2]] for t in confirmed)
    assert search.chosen in confirmed and search.chosen in (0.6, 0.7)
    assert search.fit is not None and search.fit.minimum in (0.6, 0.7)


def test_three_classes_search_two_thresholds():
    settings = SearchSettings(classes=3, iters_per_probe=3, warmup=1)
    assert settings.budget == 16 and settings.first_round_candidates() == [
        (0.2, 0.4), (0.2, 0.6), (0.2, 0.8), (0.4, 0.6), (0.4, 0.8), (0.6, 0.8)]
    search = ThresholdSearch(settings)
    seen = []

    def measure(point):
        seen.append(point)
        return 1.0 + (point[0] - 0.3) ** 2 + (point[1] - 0.7) ** 2

    with pytest.raises(ConfigError, match="thresholds_for"):
        search.threshold_for(0)
    chosen = search.run(measure)
    assert len(search.probes) == 16 and all(len(p) == 2 and p[0] < p[1] for p in seen)
    assert chosen == [pytest.approx(0.3, abs=0.1), pytest.approx(0.7, abs=0.1)]
    record = search.to_record()
    assert record["chosen_thresholds"] == chosen and record["context"]["classes"] == 3
    surface = record["surface"]
    assert len(surface["axis"]) == 21 and surface["mean_s"][0][0] is None  # t1 < t2 only
    assert surface["mean_s"][6][14] == pytest.approx(1.0, abs=0.01)


def test_settings_validate_classes_and_method():
    for bad in (dict(classes=1), dict(classes=3, method="fit"), dict(method="bayes"), dict(confirm=-1),
                dict(classes=4, candidates=(0.5, 1.0))):
        with pytest.raises(ConfigError):
            SearchSettings(**bad)


@pytest.mark.parametrize("model, bandwidth", [("vgg19", 20e9), ("vgg19", 10e9), ("resnet50", 10e9),
                                              ("resnet50", 5e9)])
def test_search_within_3_percent_of_the_sweep_with_at_most_10_probes(model, bandwidth):
    profile = resolve_profile(model)
    worst = 1.0
    for seed in range(10):
        measure, truth = analytic_measure(profile, bandwidth, noise=0.02, outlier_rate=0.05, seed=seed)
        record = run_threshold_bench(measure, SearchSettings(), profile_context(profile), true_iter_s=truth)
        extra = record["extra"]
        assert extra["probes"] <= 10 and len(record["probes"]) <= 10
        assert len(record["sweep"]) == 21
        worst = max(worst, extra["true_ratio"])
    assert worst <= 1.03, f"{model} at {bandwidth / 1e9:g} Gbit/s: chosen {100 * (worst - 1):.1f}% slower"


def _distributed_worker(rank, world_size, port, queue):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch.distributed as dist

    from geryon.categorize.reduce import TorchDistributedReducer

    store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                          timeout=__import__("datetime").timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        profile = resolve_profile("resnet50")
        measure, _ = analytic_measure(profile, 10e9, noise=0.05, outlier_rate=0.05, seed=100 + rank)
        search = ThresholdSearch(SearchSettings(), reducer=TorchDistributedReducer(),
                                 context=profile_context(profile))
        used = []
        iteration = 0
        while not search.done:
            threshold = search.threshold_for(iteration)
            used.append(threshold)
            seconds = measure(threshold) * (1.1 if rank == 2 else 1.0)  # rank 2 is slower
            search.record(iteration, seconds)
            iteration += 1
        record = search.to_record()
        queue.put((rank, search.chosen, used, record["probes"] if rank == 0 else None,
                   search.fit.to_data()))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_decision_reaches_every_rank_over_gloo():
    import multiprocessing

    import torch.distributed as dist

    world_size = 3
    master = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_distributed_worker, args=(rank, world_size, master.port, queue))
               for rank in range(world_size)]
    for worker in workers:
        worker.start()
    try:
        results = sorted(queue.get(timeout=120) for _ in range(world_size))
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    chosen = {r[1] for r in results}
    assert len(chosen) == 1 and None not in chosen
    assert results[0][2] == results[1][2] == results[2][2]  # same threshold every iteration
    assert results[0][4] == results[1][4] == results[2][4]  # same fit everywhere
    probes = results[0][3]
    assert all(len(p["times"]) == world_size for p in probes)
    for p in probes:  # the reduction is the max over ranks: rank 2's slower times
        assert p["reduced"] == [max(column) for column in zip(*p["times"])]
    assert all(w.exitcode == 0 for w in workers)
