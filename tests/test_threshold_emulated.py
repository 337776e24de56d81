"""`geryon bench threshold --backend emulated`: replayed workers over the real transport, end to end.

The root test runs a short search (2 workers, 1 server, 3 candidates, 3 iterations per probe) on an
emulated cluster and checks the RUN.json it writes, and that every threshold switch kept every
update exactly once (each drain compares the applied-update count on every rank to the iterations).
"""

import json

import time

import pytest
import torch

from geryon.bench.replay_roles import LEARNING_RATE, applied_updates
from geryon.bench.replay_roles import run_queue_wait_s
from geryon.bench.threshold import EmulatedSetup, contention_summary
from geryon.categorize.classes import threshold_split
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.runrecord import load_run
from geryon.cli import main
from geryon.errors import ConfigError


def test_applied_updates_counts_and_catches_a_stray_update():
    tensors = [torch.full((5,), -7 * LEARNING_RATE), torch.full((3,), -7 * LEARNING_RATE)]
    assert applied_updates(tensors) == 7
    tensors[1][2] -= LEARNING_RATE            # one element updated twice
    assert applied_updates(tensors) is None
    unequal = [torch.full((2,), -1 * LEARNING_RATE), torch.full((2,), -2 * LEARNING_RATE)]
    assert applied_updates(unequal) is None      # one tensor missed an update


def test_setup_scales_the_link_and_rejects_bad_values():
    setup = EmulatedSetup(bandwidth=10e9, size_scale=0.01, time_scale=1.0)
    assert setup.link_rate == 100_000_000     # 10 Gbit/s with full sizes = 100 Mbit/s with sizes / 100
    assert EmulatedSetup(bandwidth=10e9, size_scale=0.01, time_scale=2.0).link_rate == 50_000_000
    for bad in ({"workers": 0}, {"size_scale": 0}, {"time_scale": -1}, {"within_class": "lifo"}):
        with pytest.raises(ConfigError):
            EmulatedSetup(**bad)


def test_contention_summary_reads_the_slowest_workers_wait():
    # iteration 1: worker 1 is slowest and waited 0.1 of its 0.4 s; iteration 2: worker 0, 0.05 of 0.5
    summary = contention_summary([[0.3, 0.4], [0.5, 0.2]], [[0.2, 0.1], [0.05, 0.0]])
    assert summary["run_wait_share"] == pytest.approx((0.25 + 0.1) / 2)
    assert contention_summary([[0.3]], [[None]]) == {}       # no schedstat on this kernel
    waited = run_queue_wait_s()
    time.sleep(0.01)   # one wake-up at least
    after = run_queue_wait_s()
    assert waited is None or 0 <= waited.main_s <= waited.all_s
    assert after is None or after.main_schedulings > waited.main_schedulings
    assert after is None or (after.all_schedulings - waited.all_schedulings
                             >= after.main_schedulings - waited.main_schedulings)


@pytest.mark.root
@pytest.mark.slow
def test_emulated_bench_end_to_end(tmp_path, unique_name, capsys):
    out = tmp_path / "RUN.json"
    assert main(["bench", "threshold", "--backend", "emulated", "--model", "vgg19", "--workers", "2",
                 "--servers", "1", "--bandwidth", "40gbit", "--candidates", "0,0.5,1", "--budget", "3",
                 "--first-round", "3", "--iters-per-probe", "3", "--warmup", "1", "--sweep-passes", "1",
                 "--race-passes", "1", "--race-contenders", "1",
                 "--cluster-name", unique_name, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    for key in ("chosen", "chosen_iter_s", "sweep_best", "sweep_best_iter_s", "probes"):
        assert key in printed, key
    assert printed["probes"] == 3 and printed["updates_verified"] is True

    record = load_run(out)
    extra = record["extra"]
    assert record["context"]["backend"] == "emulated" and record["chosen"] in (0.0, 0.5, 1.0)
    assert [p["threshold"] for p in record["sweep"]] == [0.0, 0.5, 1.0]
    assert all(0 < p["iter_s"] < 10 for p in record["sweep"])
    assert 0 < extra["coarse_iter_s"] < 10 and 0 < extra["no_priority_iter_s"] < 10
    # the race: the sweep's best and the choice (one point if they are the same), one more probe each
    contenders = extra["sweep_contenders"]
    assert record["chosen"] in contenders and 1 <= len(contenders) <= 2 and extra["sweep_best"] in contenders
    assert extra["sweep_statistic"] == "trimmed" and extra["sweep_race_passes"] == 1
    assert 1.0 <= extra["sweep_ratio_low"] <= extra["sweep_ratio"] <= extra["sweep_ratio_high"]
    assert all(p["contender"] and p["interval"][0] <= p["interval"][1]
               for p in record["sweep"] if p["threshold"] in contenders)
    # 3 search probes + 3 sweep probes + the coarse split + the race + the re-measured choice, 3 iterations each
    iterations = (8 + len(contenders)) * 3
    verification = extra["verification"]
    assert verification["iterations"] == iterations and verification["all_ok"]
    assert verification["final_applied"] == [iterations] * 3      # 2 workers and the server
    # every switch at an iteration boundary, each with the digest of threshold_split at its threshold
    switches = extra["switches"]
    assert [s["iteration"] for s in switches] == sorted(s["iteration"] for s in switches)
    assert all(s["iteration"] % 3 == 0 for s in switches) and verification["drains"] == len(switches)
    ranking = resolve_profile("vgg19").ranking()
    for switch in switches:
        assert switch["assignment_digest"] == threshold_split(ranking, [switch["threshold"]]).digest()
    assert len(extra["worker_times"]) == iterations and all(len(t) == 2 for t in extra["worker_times"])
    # CPU contention inside the measurement: each worker's replay-thread run-queue wait per iteration
    waits = extra["worker_waits"]
    assert len(waits) == iterations and all(len(w) == 2 for w in waits)
    assert all(w is not None and 0 <= w < 10 for row in waits for w in row)
    assert 0 <= extra["run_wait_share"] <= extra["run_wait_p90_share"]
    assert all(s["loadavg"] is None or s["loadavg"] >= 0 for s in switches)
    assert extra["loadavg_start"] is None or extra["loadavg_start"] >= 0
