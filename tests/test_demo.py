"""`geryon demo`: its numbers from the example's records, its table, and a reduced run end to end."""

import json
import subprocess
import sys

import pytest

from geryon.cli import build_parser
from geryon.demo import RUNS, DemoRun, format_table, launch_argv, summarise, with_speedups
from launch_support import REPO, clean_env


def _records(times, loss=2.0):
    records = [{"iteration": i, "loss": loss, "time_s": t} for i, t in enumerate(times)]
    return records + [{"final": True, "loss": loss, "accuracy": 0.5}]


def test_iteration_time_skips_the_warmup():
    run = summarise("geryon", _records([5.0, 6.0, 7.0, 8.0, 9.0]), wall_s=30.0)
    assert run.iteration_s == 1.0 and run.images_per_s == 64.0 and run.iterations == 5
    assert summarise("x", _records([4.0]), 1.0).iteration_s == 4.0
    assert summarise("x", _records([4.0, 6.0]), 1.0).iteration_s == 2.0


def test_speedup_and_table():
    runs = with_speedups([summarise("vanilla", _records([1, 4, 7, 10]), 1.0),
                          summarise("geryon", _records([1, 2, 3, 4]), 1.0)])
    assert [r.speedup for r in runs] == [1.0, 3.0]
    table = format_table(runs)
    assert table.splitlines()[0].split() == ["run", "iteration", "images/s", "speedup", "final", "loss", "accuracy"]
    assert "3.00x" in table.splitlines()[-1]


def test_demo_runs_plain_ddp_first_then_geryon_on_the_emulated_cluster():
    """The baseline is what a DDP user runs without geryon: the script's own DDP over gloo."""
    args = build_parser().parse_args(["demo", "--iterations", "3"])
    assert args.runs.split(",") == ["ddp", "allreduce", "ps"]
    ddp, allreduce, ps = (launch_argv(RUNS[name], args) for name in args.runs.split(","))
    for argv in (ddp, allreduce, ps):
        assert argv[1:4] == ["-m", "geryon.launch", "--emulate"]
        assert argv[argv.index("--workers") + 1] == "4"
        assert argv[argv.index("--iterations") + 1] == "3" and "--log-json" in argv
    assert ddp[ddp.index("--mode") + 1] == "allreduce" and "--plain-ddp" in ddp and "--policy" not in ddp
    assert allreduce[allreduce.index("--overlap") + 1] == "next-forward" and "--plain-ddp" not in allreduce
    assert ps[ps.index("--mode") + 1] == "ps" and ps[ps.index("--servers") + 1] == "2"
    assert ps[ps.index("--policy") + 1] == "geryon"


@pytest.mark.root
@pytest.mark.slow
def test_reduced_demo_prints_json_for_every_run():
    # 2 workers and 1 server: every run and its output as with the default 4 and 2, half the processes
    result = subprocess.run([sys.executable, "-m", "geryon", "demo", "--iterations", "3", "--hidden", "256",
                             "--workers", "2", "--servers", "1", "--json"],
                            cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert [r["run"] for r in data["runs"]] == ["plain DDP", "geryon allreduce", "geryon PS"]
    for run in data["runs"]:
        assert set(run) == set(DemoRun.__dataclass_fields__)
        assert run["iterations"] == 3 and run["iteration_s"] > 0 and run["speedup"] > 0
    for run in data["runs"][1:]:
        assert run["final_loss"] == pytest.approx(data["runs"][0]["final_loss"], rel=1e-4)
    assert "plain DDP        iteration   3/3" in result.stderr
    assert "geryon allreduce iteration   1/3" in result.stderr
