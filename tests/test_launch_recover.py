"""Recovery: `--max-restarts N` starts a failed job again, whole; `--ps-checkpoint-every K` lets the restart
resume from the servers' last consistent step. A worker, and separately a server, SIGKILLed in the middle
of training (tests/recover_script.py) end with the parameters of one process trained on the same data; a
job that keeps failing stops after N restarts with the cause."""

import json
import sys

import pytest
import torch

from geryon.errors import ConfigError
from geryon.launch.config import parse_launch_args
from geryon.runtime import server_checkpoint as sc
from geryon.runtime.env import RankEnv
from launch_support import EXAMPLE, EXAMPLE_ARGS, REPO, json_records, loss_curve, one_process_result, \
    rank_lines, run_launcher


SCRIPT = REPO / "tests" / "recover_script.py"
PS = ["--local", "--mode", "ps", "--workers", "2", "--servers", "1", "--grace", "1"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final parameters of one process trained on the same global batches (the reference)."""
    return one_process_result(SCRIPT, tmp_path_factory.mktemp("reference") / "final.pt")


@pytest.mark.slow
@pytest.mark.parametrize("kill, at, resumed", [("worker", 5, (2, 4)), ("server", 7, (6,))])
def test_killed_rank_restarts_from_server_checkpoint(tmp_path, uninterrupted, kill, at, resumed):
    out = tmp_path / "final.pt"
    result = run_launcher(*PS, "--max-restarts", 1, "--ps-checkpoint-every", 2, "--ps-checkpoint-dir",
                          tmp_path / "ckpt", SCRIPT, "--kill", kill, "--kill-at", at, "--out", out, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{kill}" in result.stderr and "was killed by SIGKILL; restarting the job (restart 1 of 1)" in \
        result.stderr
    # the restart resumed from a consistent step written before the kill (a step being written when
    # the worker died may be missing), not from the start
    starts = [line for line in result.stdout.splitlines() if line.startswith("[worker0] start 1 resumes")]
    assert starts and int(starts[0].rsplit(" ", 1)[1]) in resumed, result.stdout
    got = torch.load(out, weights_only=True)
    assert got.keys() == uninterrupted.keys()
    for key in got:
        torch.testing.assert_close(got[key], uninterrupted[key], rtol=1e-5, atol=1e-6, msg=key)
    assert sc.consistent_steps(str(tmp_path / "ckpt")) == [6, 8]   # the last two kept


def test_job_that_keeps_failing_stops_after_n_restarts(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\n"
                      "print('start', os.environ['GERYON_RESTART_COUNT'], os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                      "sys.exit(3)\n")
    result = run_launcher("--local", "--workers", "1", "--max-restarts", "2", script, timeout=60)
    assert result.returncode == 3
    assert [line for line in result.stdout.splitlines() if "start" in line] == \
        ["[worker0] start 0 0", "[worker0] start 1 1", "[worker0] start 2 2"]
    assert result.stderr.count("restarting the job") == 2
    assert "error: worker0 failed with exit code 3; gave up after 2 restarts" in result.stderr


def _write_step(directory, step, servers, marked=True, files=None):
    for index in range(servers if files is None else files):
        (directory / sc.SERVER_FILE.format(step=step, index=index, count=servers)).write_bytes(b"")
    if marked:
        (directory / sc.MARKER.format(step=step)).write_text(json.dumps({"step": step, "servers": servers}))


def test_consistent_step_needs_marker_and_every_server_file(tmp_path):
    _write_step(tmp_path, 2, 2)
    _write_step(tmp_path, 4, 2, files=1)          # a server's file missing
    _write_step(tmp_path, 6, 2, marked=False)     # servers wrote, worker 0 did not mark it
    assert sc.consistent_steps(str(tmp_path)) == [2]
    assert sc.resume_step(str(tmp_path)) == 2
    assert sc.resume_step(str(tmp_path / "absent")) == 0


def test_prune_keeps_the_last_two_consistent_steps(tmp_path):
    for step in (2, 4, 6):
        _write_step(tmp_path, step, 1)
    _write_step(tmp_path, 3, 1, marked=False)
    (tmp_path / ".step-000000002.server-0-of-1.pt.x1y2.tmp").write_bytes(b"")   # a write cut short
    sc.StepCheckpoints(str(tmp_path), 2, 1, None).prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000004.done", "step-000000004.server-0-of-1.pt",
        "step-000000006.done", "step-000000006.server-0-of-1.pt"]


@pytest.mark.parametrize("flags, message", [
    (["--ps-checkpoint-every", "2"], "go together"),
    (["--mode", "allreduce", "--ps-checkpoint-every", "2", "--ps-checkpoint-dir", "d"], "--mode ps only"),
    (["--mode", "ps", "--ps-optimizer", "worker", "--ps-checkpoint-every", "2", "--ps-checkpoint-dir", "d"],
     "save the script's own checkpoint"),
    (["--max-restarts", "-1"], "at least 0"),
])
def test_recovery_flags_checked_before_start(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_launch_args(["--local", *flags, sys.executable], environ={})


@pytest.mark.slow
def test_example_started_on_a_checkpoint_dir_goes_on_from_its_step(tmp_path, single_curve):
    """examples/train_cnn.py in ps mode: a job started on a directory holding a consistent step S (here
    from a first job of 10 iterations) resumes at S, skips the batches of 0..S-1 and follows the
    single-process curve from there."""
    flags = [*PS, "--ps-checkpoint-every", 5, "--ps-checkpoint-dir", tmp_path, EXAMPLE, *EXAMPLE_ARGS]
    first = run_launcher(*flags, "--iterations", 10, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sc.consistent_steps(str(tmp_path)) == [5, 10]
    second = run_launcher(*flags, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    records = json_records(rank_lines(second.stdout, "worker0"))
    assert [r["iteration"] for r in records if "iteration" in r] == list(range(10, 20))
    assert records[-1]["resumed_from"] == 10
    assert loss_curve(records) == pytest.approx(single_curve[10:], rel=1e-4, abs=1e-5)


def test_a_rank_reads_its_restart_count_and_resumed_step(tmp_path):
    _write_step(tmp_path, 4, 1)
    job = {"GERYON_MODE": "ps", "GERYON_PS_CHECKPOINT_EVERY": "2", "GERYON_PS_CHECKPOINT_DIR": str(tmp_path),
           "GERYON_RESTART_COUNT": "3", "TORCHELASTIC_RESTART_COUNT": "3"}
    ctx = RankEnv.from_environ(job)
    assert (ctx.restart_count, ctx.resumed_step) == (3, 4)
    assert RankEnv.from_environ({"TORCHELASTIC_RESTART_COUNT": "2"}).restart_count == 2   # plain torchrun
    assert RankEnv.from_environ({**job, "GERYON_MODE": "allreduce"}).resumed_step == 0
