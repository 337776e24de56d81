"""The sweep's yardstick: statistics, probe-bootstrap intervals, and the race over the contenders."""

import numpy as np
import pytest

from geryon.bench.sweep import SweepRace, analytic_measure, run_threshold_bench
from geryon.bench.sweep_stats import estimate, interval, ratio_interval
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.search import SearchSettings
from geryon.errors import ConfigError


def test_statistics_on_two_modes_and_an_outlier():
    values = [0.30] * 8 + [0.23] * 2 + [0.9]       # two compute-only iterations and one GC pause
    assert estimate(values, "median") == 0.30
    assert estimate(values, "mean") == pytest.approx(np.mean(values))
    # the trimmed mean drops one iteration at each end (10% of 11, rounded down): the pause and one fast
    assert estimate(values, "trimmed") == pytest.approx((0.30 * 8 + 0.23) / 9)
    assert estimate([0.5, 0.7], "trimmed") == pytest.approx(0.6)   # nothing to cut
    with pytest.raises(ConfigError, match="trimmed"):
        estimate(values, "mode")


def test_intervals_resample_whole_probes():
    tight = [[0.300, 0.301, 0.299]] * 6
    low, high = interval(tight, "mean")
    assert low == pytest.approx(0.300) and high == pytest.approx(0.300)
    # probes that disagree with each other widen the interval even if each probe is tight inside
    apart = [[0.28] * 10, [0.32] * 10] * 3
    low, high = interval(apart, "mean", seed=1)
    assert low < 0.295 and high > 0.305
    assert low >= 0.28 and high <= 0.32


def test_ratio_interval_and_within_share():
    blocks = {0.5: [[0.300] * 10] * 8, 0.7: [[0.330] * 10] * 8, 0.9: [[0.306] * 10] * 8}
    sure = ratio_interval(blocks, 0.9, [0.5, 0.7, 0.9], "trimmed")
    assert sure["low"] == pytest.approx(1.02) and sure["high"] == pytest.approx(1.02)
    assert sure["within_share"] == 1.0
    worse = ratio_interval(blocks, 0.7, [0.5, 0.7, 0.9], "trimmed")
    assert worse["low"] == pytest.approx(1.1) and worse["within_share"] == 0.0
    rng = np.random.default_rng(0)
    noisy = {t: [list(m * (1 + 0.05 * rng.standard_normal(10))) for _ in range(4)]
             for t, m in ((0.5, 0.300), (0.9, 0.306))}
    unsure = ratio_interval(noisy, 0.9, [0.5, 0.9], "mean", seed=2)
    assert unsure["low"] == 1.0 or unsure["low"] < 1.02 < unsure["high"]
    assert 0 < unsure["within_share"] < 1


def test_contenders_are_the_nearest_to_the_best_and_the_choice():
    points = [{"threshold": t, "iter_s": s} for t, s in ((0.0, 0.40), (0.3, 0.31), (0.5, 0.30), (0.6, 0.305),
                                                         (0.8, 0.34), (1.0, 0.40))]
    race = SweepRace(contenders=3, margin=0.08)
    assert [p["threshold"] for p in race.contenders_of(points, 0.6)] == [0.5, 0.6, 0.3]
    # beyond the margin a candidate stays out even among the first three; the choice is always in
    assert [p["threshold"] for p in SweepRace(contenders=3, margin=0.02).contenders_of(points, 1.0)] == \
        [0.5, 0.6, 1.0]
    with pytest.raises(ConfigError):
        SweepRace(contenders=0)
    with pytest.raises(ConfigError):
        SweepRace(statistic="mode")


def test_race_measures_the_contenders_more_and_reports_the_ratio_interval(tmp_path):
    profile = resolve_profile("resnet50")
    settings = SearchSettings(iters_per_probe=6, warmup=1)
    calls = []
    measure, _truth = analytic_measure(profile, 10e9, noise=0.03, outlier_rate=0.0, seed=4)

    def counted(threshold):
        calls.append(threshold)
        return measure(threshold)

    race = SweepRace(contenders=3, passes=5)
    record = run_threshold_bench(counted, settings, sweep=True, sweep_passes=2, seed=4, race=race)
    extra = record["extra"]
    contenders = extra["sweep_contenders"]
    assert record["chosen"] in contenders and 2 <= len(contenders) <= 4
    assert extra["sweep_best"] in contenders and extra["sweep_statistic"] == "trimmed"
    by_threshold = {p["threshold"]: p for p in record["sweep"]}
    for t, point in by_threshold.items():
        probes = len(point["times"]) // settings.iters_per_probe
        assert probes == (2 + 5 if t in contenders else 2), t
        assert point.get("contender", False) == (t in contenders)
    low, high = by_threshold[extra["sweep_best"]]["interval"]
    assert low <= extra["sweep_best_iter_s"] <= high
    assert 1.0 <= extra["sweep_ratio_low"] <= extra["sweep_ratio"] <= extra["sweep_ratio_high"] + 1e-12
    assert 0 <= extra["sweep_within_share"] <= 1
    # search + 2 passes over the 21 candidates + race + the re-measured choice
    assert len(calls) == settings.iters_per_probe * (10 + 2 * 21 + 5 * len(contenders) + 1)
    # the record stays valid RUN.json and its report gives the interval
    from geryon.categorize.report import summarize_threshold_run
    from geryon.categorize.runrecord import load_run, write_run

    path = write_run(tmp_path / "RUN.json", record)
    text = summarize_threshold_run(load_run(path))
    assert f"race over {len(contenders)} contenders (5 more passes, trimmed)" in text
    assert f"[{extra['sweep_ratio_low']:.3f}, {extra['sweep_ratio_high']:.3f}]" in text


def test_without_a_race_the_sweep_is_as_before():
    profile = resolve_profile("vgg19")
    measure, truth = analytic_measure(profile, 20e9, noise=0.02, seed=1)
    record = run_threshold_bench(measure, SearchSettings(), sweep=True, true_iter_s=truth, seed=1)
    extra = record["extra"]
    assert "sweep_contenders" not in extra and "sweep_ratio_low" not in extra
    for point in record["sweep"]:
        kept = [t for start in range(0, len(point["times"]), 5) for t in point["times"][start + 1:start + 5]]
        assert point["iter_s"] == pytest.approx(float(np.median(kept)))


def test_phase_summary_finds_compute_only_iterations_after_a_spread():
    from geryon.bench.threshold_phase import summarize

    rows, clock = [], 0.0
    for index in range(40):
        fast = index % 5 == 0                     # every fifth iteration the parameters were all there
        blocked = 0.005 if fast else 0.09
        spread = 0.06 if index % 5 == 4 else 0.005    # ... after an iteration whose workers ended apart
        workers = [{"start": clock, "seconds": 0.225 + blocked - spread * (rank / 3), "blocked_s": blocked}
                   for rank in range(4)]
        rows.append({"sent": clock, "received": clock + 0.33, "workers": workers})
        clock += 0.225 + blocked + 0.0015
    summary = summarize({"rows": rows})
    assert summary["compute_only_share"] == pytest.approx(7 / 37)
    assert summary["compute_s"] == pytest.approx(0.225)
    assert summary["driver_gap_s"] == pytest.approx(0.0015)
    assert summary["corr_end_spread_next_iteration"] < -0.9
    free = summarize({"free_running": True, "rows": rows})
    assert free["mean_s"] == pytest.approx(summary["mean_s"] + 0.0015, rel=0.01)
