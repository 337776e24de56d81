"""The simulator's ring model (allreduce mode): buckets, class order on the ring, the next forward."""

import json

import pytest

from geryon.categorize.profiles import LayerProfile, ProfileLayer
from geryon.cli import main
from geryon.errors import ConfigError
from geryon.sim.ring import (RingSetting, compare_ring, comparison_table, ring_buckets, ring_finish_times,
                             simulate_ring, split_cell)
from geryon.sim.scenario import payload_rate

MIB = 1024 * 1024


def toy(conv_bytes: int, fc_bytes: int) -> LayerProfile:
    """A conv layer then a dense one, 10 ms forward and 10 ms backward each."""
    return LayerProfile("toy", 32, "test", (ProfileLayer("c", "Conv2d", 10e6, 10e6, conv_bytes),
                                            ProfileLayer("d", "Linear", 10e6, 10e6, fc_bytes)))


def test_ring_order_fifo_keeps_launch_order_and_priority_preempts_bulk():
    # the bulk bucket (class 1) is ready at 10 ms and needs 100 ms; the urgent one at 20 ms, 20 ms
    assert ring_finish_times([0.010, 0.020], [0.100, 0.020], [1, 0], preemptive=False) == \
        pytest.approx([0.110, 0.130])
    # preempted at 20 ms with 90 ms left; the urgent bucket ends at 40 ms, the bulk at 130 ms
    assert ring_finish_times([0.010, 0.020], [0.100, 0.020], [1, 0], preemptive=True) == \
        pytest.approx([0.130, 0.040])
    # an idle gap: the second bucket starts when it is ready
    assert ring_finish_times([0.0, 0.5], [0.1, 0.1], [0, 0], preemptive=True) == pytest.approx([0.1, 0.6])


def test_buckets_cut_at_ddp_size_and_at_the_class_only_for_class_policies():
    profile = LayerProfile("toy", 32, "test", (ProfileLayer("c1", "Conv2d", 1, 1, 12 * MIB),
                                               ProfileLayer("c2", "Conv2d", 1, 1, 12 * MIB),
                                               ProfileLayer("d", "Linear", 1, 1, 4 * MIB)))
    # backward order d, c2, c1; vanilla: one class, cut by size (25 MiB) only
    assert [(b.tensors, b.nbytes, b.cls) for b in ring_buckets(profile, "vanilla")] == \
        [((2, 1), 16 * MIB, 0), ((0,), 12 * MIB, 0)]
    assert [(b.tensors, b.cls) for b in ring_buckets(profile, "geryon")] == [((2,), 1), ((1, 0), 0)]
    assert [b.tensors for b in ring_buckets(profile, "endhost")] == [(2,), (1, 0)]


def test_overlap_with_priority_starts_the_next_forward_early_by_hand():
    # 2 workers: each link carries 2(n-1)/n = 1 x a bucket. FC takes 100 ms on the ring, conv 20 ms.
    setting = RingSetting(model="toy", workers=2, bw_bps=10e9, compute_scale=1.0)
    rate = payload_rate(10e9) / 8
    profile = toy(conv_bytes=int(0.020 * rate), fc_bytes=int(0.100 * rate))
    cell = {(p, o): simulate_ring(setting, p, o, profile=profile)["iteration_s"]
            for p in ("vanilla", "geryon") for o in ("barrier", "next-forward")}
    # barrier: the ring ends 110 ms after backward does (FC from 10 ms on, conv after or preempting
    # it), then 40 ms of compute: 150 ms whatever the order
    assert cell[("vanilla", "barrier")] == pytest.approx(0.150, abs=1e-6)
    assert cell[("geryon", "barrier")] == pytest.approx(0.150, abs=1e-6)
    # FIFO puts the conv bucket last: overlapping gains nothing
    assert cell[("vanilla", "next-forward")] == pytest.approx(0.150, abs=1e-6)
    # geryon: conv lands 20 ms after backward ends, conv forward runs while FC still travels
    assert cell[("geryon", "next-forward")] == pytest.approx(0.140, abs=1e-6)


def test_compute_bound_ring_hides_the_network_whatever_the_order():
    # 100 ms per layer and pass; FC (its own 30 MiB bucket) takes 46 ms on the ring, during conv's backward
    setting = RingSetting(model="toy", workers=8, bw_bps=10e9, compute_scale=10.0)
    profile = toy(conv_bytes=MIB, fc_bytes=30 * MIB)
    rows = [simulate_ring(setting, p, o, profile=profile) for p in ("vanilla", "geryon")
            for o in ("barrier", "next-forward")]
    ring_tail = 2 * 7 / 8 * MIB / (payload_rate(10e9) / 8)   # the conv bucket after the last gradient
    for row in rows:
        assert row["compute_s"] == pytest.approx(0.400)
        assert row["iteration_s"] == pytest.approx(0.400 + ring_tail, rel=1e-6)


def test_cells_names_and_refusals():
    assert split_cell("geryon+overlap") == ("geryon", "next-forward")
    assert split_cell("vanilla") == ("vanilla", "barrier")
    with pytest.raises(ConfigError, match="ring model"):
        split_cell("geryon+bytes")
    with pytest.raises(ConfigError, match="at least 2 workers"):
        RingSetting(workers=1)
    with pytest.raises(ConfigError, match="overlap"):
        simulate_ring(RingSetting(), "geryon", "sometimes")


def test_compare_puts_the_model_beside_measured_allreduce_rows(tmp_path, capsys):
    setting = RingSetting(model="vgg19", workers=8, bw_bps=10e9, compute_scale=4.0)
    simulated = simulate_ring(setting, "geryon", "next-forward")["iteration_s"]
    rows = [{"mode": "allreduce", "model": "vgg19", "link": "10gbe", "policy": "geryon+overlap", "workers": 8,
             "bw_bits": 10e9, "time_scale": 4.0, "batch": 32, "iteration_s": simulated * 1.05,
             "scaling_efficiency": 0.6},
            {"mode": "ps", "model": "vgg19", "link": "10gbe", "policy": "geryon", "iteration_s": 1.0}]
    results, skipped = compare_ring(rows)
    assert skipped == 1 and len(results) == 1
    assert results[0]["error"] == pytest.approx(1 / 1.05 - 1)
    assert "met" in comparison_table(results) and "-4.8%" in comparison_table(results)
    path = tmp_path / "paper.json"
    path.write_text(json.dumps({"settings": {"mode": "allreduce"}, "rows": rows}))
    assert main(["sim", "--mode", "allreduce", "--compare", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| vgg19 | 10gbe | geryon+overlap |" in out and "1 rows compared, 1 skipped" in out
    assert main(["sim", "--mode", "allreduce", "--compare", str(path), str(path)]) == 1   # one paper file
    assert "only with --jobs" in capsys.readouterr().err


def test_sim_mode_allreduce_prints_each_policy_with_and_without_overlap(capsys):
    assert main(["sim", "--mode", "allreduce", "--model", "vgg19", "--policy", "vanilla,geryon",
                 "--compute-scale", "4", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["cell"] for r in rows] == ["vanilla", "vanilla+overlap", "geryon", "geryon+overlap"]
    by_cell = {r["cell"]: r for r in rows}
    assert by_cell["vanilla"]["speedup_vs_vanilla"] == 1.0
    # network-bound at this compute scale: only priority with the overlap shortens the iteration
    assert by_cell["vanilla+overlap"]["iteration_s"] == pytest.approx(by_cell["vanilla"]["iteration_s"])
    assert by_cell["geryon+overlap"]["speedup_vs_vanilla"] > 1.1


@pytest.mark.parametrize("model", ["vgg19", "resnet50", "alexnet", "inceptionv3"])
def test_the_model_cuts_the_buckets_the_replayed_ring_reduces(model):
    import torch

    from geryon.bench.replay_ddp import DDP_BUCKET_BYTES, ring_buckets as replayed_buckets
    from geryon.categorize.classes import coarse_split
    from geryon.categorize.profiles import resolve_profile

    profile = resolve_profile(model, batch=32)
    ranking = profile.ranking()
    params = [torch.zeros(max(1, round(p.bytes / 4 * 0.01))) for p in ranking]   # the bench's size scale
    coarse = [(cls, 0) for cls in coarse_split(ranking, max_classes=2).class_of]
    for policy, priorities in (("vanilla", [(0, 0)] * len(ranking)), ("geryon", coarse)):
        replayed = replayed_buckets(params, priorities, DDP_BUCKET_BYTES * 0.01)
        assert replayed == [list(b.tensors) for b in ring_buckets(profile, policy)]
