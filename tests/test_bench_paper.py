"""`geryon bench paper` end to end on a tiny configuration: 2 colocated hosts, AlexNet, few iterations."""

import json
import os
import subprocess
import sys

import pytest

from geryon.bench.paper_trace import forward_waits
from launch_support import REPO, clean_env

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, tc)")]


def test_bench_paper_tiny_run_writes_rows_table_chart_and_traces(tmp_path):
    out, timeline = tmp_path / "out", tmp_path / "tl"
    argv = [sys.executable, "-m", "geryon.cli", "bench", "paper", "--model", "alexnet", "--link", "10gbe",
            "--workers", "2", "--repetitions", "2", "--warmup", "1", "--iterations", "2",
            "--compute-scale", "11", "--slice-params", "256K", "--json", "--out", str(out),
            "--timeline", str(timeline)]
    done = subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    scaling = [r for r in rows if r["table"] == "scaling"]
    assert [r["policy"] for r in scaling] == ["vanilla", "slicing", "endhost", "geryon", "control-nolimit"]
    for row in scaling:
        assert row["model"] == "alexnet" and row["workers"] == 2 and row["layout"] == "colocated"
        assert row["congestion"] == "bbr" and row["time_scale"] == 11.0 and row["size_scale"] == 0.01
        assert 0 < row["scaling_efficiency"] <= 1.05 and row["iteration_s"] > 0
        assert row["images_per_s"] == pytest.approx(2 * 32 / row["iteration_s"])
        assert row["iterations"] == 4     # 2 repetitions x 2 measured iterations
    vanilla = scaling[0]
    assert vanilla["paper_scaling_efficiency"] == 0.364 and vanilla["speedup_vs_vanilla"] == 1.0
    assert vanilla["bw_bits"] == 10e9 and vanilla["link_rate_bits"] == 100_000_000
    assert scaling[-1]["paper_scaling_efficiency"] is None and scaling[-1]["bw_bits"] is None
    slicing = [r for r in rows if r["table"] == "slicing"]
    assert {(r["policy"], r["slice_params"]) for r in slicing} == {("geryon", 262144), ("endhost", 262144)}
    assert slicing[0]["paper_images_per_s"] in (272.8, 216.8)
    record = json.loads((out / "paper.json").read_text())
    assert record["compute_scale"] == 11.0 and record["calibration"] is None
    assert all(v["all_ok"] for v in record["cpu"]["verification"].values())
    # the machine's busy share and, apart from it, the share the hypervisor gave other guests (steal)
    assert 0 <= record["cpu"]["machine_share_run"] <= 1 and 0 <= record["cpu"]["steal_share_run"] < 1
    assert 0 <= scaling[-1]["cpu_machine_share"] <= 1 and 0 <= scaling[-1]["cpu_steal_share"] < 1
    assert "| alexnet | 10gbe | bbr | geryon |" in (out / "paper.md").read_text()
    assert (out / "paper.png").stat().st_size > 1000
    traces = sorted(p.name for p in timeline.iterdir())
    assert "alexnet-10gbe-bbr-geryon.json" in traces and not any(p.endswith(".part.json") for p in traces)
    waits = forward_waits(timeline / "alexnet-10gbe-bbr-geryon.json")
    assert waits["worker_iterations"] == 2 * 3 and waits["first_layer"]
