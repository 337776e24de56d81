"""`--start fork` (geryon.launch.template): a rank forked from the launcher's template sees what a rank
started as a new interpreter (`--start exec`) sees, ends with the same exit codes, and dies with its
launcher."""

import json
import signal
import time

import pytest

from geryon.errors import ConfigError
from geryon.launch.config import parse_launch_args
from launch_support import REPO, assert_no_processes, rank_lines, run_launcher, start_launcher

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "start_probe_script.py"
LOCAL2 = ["--local", "--workers", "2", "--grace", "1"]


def _probe(tmp_path, start: str, *script_args) -> tuple:
    out = tmp_path / start
    out.mkdir()
    run = run_launcher(*LOCAL2, "--start", start, SCRIPT, "--out-dir", out, *script_args, timeout=120)
    seen = {rank: json.loads(rank_lines(run.stdout, f"worker{rank}")[0]) for rank in (0, 1)}
    return run, seen, out


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The probe under each start, once for the module."""
    return {start: _probe(tmp_path_factory.mktemp(start), start) for start in ("exec", "fork")}


def test_a_forked_rank_sees_what_a_new_interpreter_sees(both):
    (exec_run, exec_seen, _), (fork_run, fork_seen, _) = both["exec"], both["fork"]
    assert exec_run.returncode == fork_run.returncode == 0, (exec_run.stderr[-2000:], fork_run.stderr[-2000:])
    same = ("name", "file", "path0", "main_is_this", "rank", "world", "pickled", "threads",
            "main_warning_shown", "session_leader", "stdout_line_buffered")
    for rank in (0, 1):
        assert {k: fork_seen[rank][k] for k in same} == {k: exec_seen[rank][k] for k in same}
        assert fork_seen[rank]["argv"] == [str(SCRIPT), "--out-dir", str(fork_seen[rank]["argv"][2])]
        assert fork_seen[rank]["name"] == "__main__" and fork_seen[rank]["session_leader"]
        assert fork_seen[rank]["comm"] == f"worker{rank}"   # what ps and top show of a forked rank
    # each rank's global generators are seeded from the OS, as in a new interpreter
    assert fork_seen[0]["random"] != fork_seen[1]["random"]
    assert fork_seen[0]["numpy"] != fork_seen[1]["numpy"]


def test_a_forked_rank_exits_as_an_interpreter_does(both):
    for start in ("exec", "fork"):
        _, _, out = both[start]
        for rank in (0, 1):
            assert (out / f"atexit-{rank}.txt").exists(), start       # atexit handlers ran
            assert (out / f"thread-{rank}.txt").exists(), start       # non-daemon threads were joined
            assert (out / f"left-open-{rank}.txt").read_text() == "written, never flushed nor closed", start


@pytest.mark.parametrize("args,code,message", [
    (["--exit", "3"], 3, "worker0 failed with exit code 3"),
    (["--raise"], 1, "RuntimeError: rank 0 raised"),
    (["--interrupt"], 128 + signal.SIGINT, "killed by SIGINT"),
], ids=["sys-exit", "exception", "keyboard-interrupt"])
def test_exit_codes_are_the_interpreters(tmp_path, args, code, message):
    run = run_launcher(*LOCAL2, "--workers", "1", "--start", "fork", SCRIPT, "--out-dir", tmp_path, *args,
                       timeout=120)
    assert run.returncode == code, run.stderr[-2000:]
    assert message in run.stderr


def test_forked_ranks_die_with_a_killed_launcher(tmp_path):
    script = tmp_path / f"gyfork{time.monotonic_ns()}.py"
    script.write_text(SCRIPT.read_text())
    launcher = start_launcher(*LOCAL2, "--start", "fork", script, "--out-dir", tmp_path, "--wait")
    try:
        ready = 0
        for line in launcher.stdout:
            ready += line.endswith("ready\n")
            if ready == 2:
                break
        assert ready == 2
        launcher.kill()
        launcher.wait()
        assert_no_processes(script.name, within=10.0)
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
        launcher.stderr.close()


def test_start_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="unknown --start 'spawn'; choose one of exec, fork"):
        parse_launch_args(["--local", "--start", "spawn", str(SCRIPT)], environ={})
    assert parse_launch_args(["--local", str(SCRIPT)], environ={"GERYON_START": "fork"}).start == "fork"
    assert parse_launch_args(["--local", str(SCRIPT)], environ={}).start == "exec"
