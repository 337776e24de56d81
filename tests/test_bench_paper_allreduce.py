"""`geryon bench paper --mode allreduce` end to end on a tiny ring (2 colocated hosts, AlexNet), and its
settings: +overlap cells only in allreduce mode, each policy with and without the overlap by default."""

import json
import os
import subprocess
import sys

import pytest

from geryon.bench.paper import PaperSettings
from geryon.bench.paper_cli import allreduce_policies
from geryon.errors import ConfigError
from geryon.sim.compare import load_rows
from geryon.sim.ring import compare_ring
from launch_support import REPO, clean_env


def test_allreduce_cells_each_policy_with_the_barrier_and_with_the_overlap():
    assert allreduce_policies(("vanilla", "geryon")) == ("vanilla", "vanilla+overlap", "geryon", "geryon+overlap")
    assert allreduce_policies(("vanilla", "geryon+overlap")) == ("vanilla", "geryon+overlap")   # as given
    with pytest.raises(ConfigError, match="--pull ahead"):
        PaperSettings(policies=("geryon+overlap",))
    with pytest.raises(ConfigError, match="mode"):
        PaperSettings(mode="nccl")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, tc)")
def test_bench_paper_allreduce_tiny_ring_applies_every_reduction_once(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "geryon.cli", "bench", "paper", "--mode", "allreduce", "--model", "alexnet",
            "--link", "10gbe", "--workers", "2", "--policies", "vanilla,geryon+overlap", "--repetitions", "1",
            "--warmup", "1", "--iterations", "2", "--compute-scale", "11", "--json", "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["policy"], r["overlap"]) for r in rows] == [("vanilla", "barrier"), ("geryon+overlap", "next-forward")]
    for row in rows:
        assert row["mode"] == "allreduce" and row["table"] == "scaling" and row["workers"] == 2
        assert row["paper_scaling_efficiency"] is None and row["error_points"] is None   # the paper: PS only
        assert row["iterations"] == 2 and row["images_per_s"] == pytest.approx(2 * 32 / row["iteration_s"])
        assert row["scaling_efficiency"] == pytest.approx(row["compute_s"] / row["iteration_s"])
    assert rows[0]["speedup_vs_vanilla"] == 1.0
    record = json.loads((out / "paper.json").read_text())
    # every rank's parameters are exactly -n x the learning rate after n averaged all-ones gradients:
    # each of the 2 segments' 3 iterations reduced and applied once, on both ranks alike
    assert record["cpu"]["verification"]["alexnet"] == {"drains": 2, "all_ok": True, "iterations": 6}
    assert record["calibration"] is None and record["slicing_rows"] == []
    assert "Mode: **allreduce**" in (out / "paper.md").read_text()
    results, skipped = compare_ring(load_rows(out / "paper.json"))     # what sim --mode allreduce --compare prints
    assert skipped == 0 and [r["policy"] for r in results] == ["vanilla", "geryon+overlap"]
    assert all(r["measured_s"] == row["iteration_s"] and r["simulated_s"] > 0 for r, row in zip(results, rows))
