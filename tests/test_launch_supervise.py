"""Supervision through the real launcher (local backend): failures stop everything, nothing is left over."""

import os
import signal
import time

import pytest

from launch_support import assert_no_processes, clean_env, marker, rank_pid, run_launcher, start_launcher


# Every rank records its PID, starts a grandchild (to check whole process groups are stopped), says
# it is ready, then behaves as told by FAIL_RANK / FAIL_CODE / IGNORE_TERM.
RANK_SCRIPT = """
import os, signal, subprocess, sys, time
from pathlib import Path
state = Path(sys.argv[1]); word = sys.argv[2]
name = os.environ["GERYON_RANK_NAME"]
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", word])
(state / f"{name}.pid").write_text(str(os.getpid()))
print(f"{name} ready", flush=True)
if name == os.environ.get("FAIL_RANK"):
    time.sleep(0.5)
    print(f"{name}: giving up on purpose", file=sys.stderr, flush=True)
    sys.exit(int(os.environ["FAIL_CODE"]))
time.sleep(300)
"""


@pytest.fixture
def rank_script(tmp_path):
    path = tmp_path / "rank.py"
    path.write_text(RANK_SCRIPT)
    return path


def _wait_for(paths, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"ranks never became ready: {[str(p) for p in paths]}"
        time.sleep(0.1)


@pytest.mark.slow
def test_output_is_prefixed_and_success_is_zero(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os, sys\nprint('hello', os.environ['RANK'], os.environ['WORLD_SIZE'])\n"
                      "print('oops', file=sys.stderr)\n")
    result = run_launcher("--local", "--workers", "3", script)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[worker0] hello 0 3", "[worker1] hello 1 3",
                                                  "[worker2] hello 2 3"]
    assert "[worker1] oops" in result.stderr and "all 3 workers finished" in result.stderr


@pytest.mark.slow
def test_failing_rank_stops_the_others(rank_script, tmp_path):
    word = marker()
    result = run_launcher("--local", "--workers", "3", rank_script, tmp_path, word,
                          env=clean_env(FAIL_RANK="worker1", FAIL_CODE="3"))
    assert result.returncode == 3
    assert "error: worker1 failed with exit code 3" in result.stderr
    assert "last lines of worker1:\n    worker1: giving up on purpose" in result.stderr
    assert_no_processes(word)


@pytest.mark.timing
@pytest.mark.slow
def test_rank_ignoring_sigterm_is_killed_after_grace(rank_script, tmp_path):
    word = marker()
    started = time.monotonic()
    result = run_launcher("--local", "--workers", "2", "--grace", "1", rank_script, tmp_path, word,
                          env=clean_env(FAIL_RANK="worker0", FAIL_CODE="5", IGNORE_TERM="1"))
    assert result.returncode == 5
    assert time.monotonic() - started < 30
    assert_no_processes(word)


@pytest.mark.timing
@pytest.mark.slow
def test_timeout_stops_the_job(rank_script, tmp_path):
    word = marker()
    result = run_launcher("--local", "--workers", "2", "--timeout", "2", rank_script, tmp_path, word)
    assert result.returncode == 124 and "timed out after 2 s" in result.stderr
    assert_no_processes(word)


@pytest.mark.parametrize("victim, options", [("worker1", ()),
                                             ("server1", ("--mode", "ps", "--servers", "2"))])
@pytest.mark.slow
def test_killed_rank_ends_the_job(rank_script, tmp_path, victim, options):
    word = marker()
    launcher = start_launcher("--local", *options, "--workers", "2", rank_script, tmp_path, word)
    try:
        _wait_for([tmp_path / "worker0.pid", tmp_path / "worker1.pid"])
        os.kill(rank_pid(launcher.pid, victim), signal.SIGKILL)
        _out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + signal.SIGKILL
        assert f"{victim} was killed by SIGKILL" in err
    finally:
        launcher.kill()
        launcher.wait()
    assert_no_processes(word)


@pytest.mark.slow
def test_ctrl_c_stops_everything(rank_script, tmp_path):
    word = marker()
    launcher = start_launcher("--local", "--workers", "2", "--grace", "1", rank_script, tmp_path, word,
                              env=clean_env(IGNORE_TERM="1"))
    try:
        _wait_for([tmp_path / "worker0.pid", tmp_path / "worker1.pid"])
        launcher.send_signal(signal.SIGINT)
        _out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130
        assert "interrupted" in err
    finally:
        launcher.kill()
        launcher.wait()
    assert_no_processes(word)


def test_ctrl_c_between_two_output_pumps_still_stops_the_job(monkeypatch):
    """A real SIGINT to the launcher's process lands while a rank's second output pump is being
    started (the first already runs): the job ends as interrupted (130), the rank is stopped, and no
    pump that never started is joined (that raised RuntimeError and exit 1)."""
    import io
    import subprocess
    import sys

    from geryon.launch import supervise as supervision
    from geryon.launch.placement import RankSpec

    real_start, starts = supervision.OutputPump.start, []

    def start_then_interrupt(pump):
        starts.append(pump.name)
        if len(starts) == 2:                     # the rank's stdout pump, after its stderr pump
            signal.raise_signal(signal.SIGINT)   # Python turns it into KeyboardInterrupt here
        real_start(pump)

    monkeypatch.setattr(supervision.OutputPump, "start", start_then_interrupt)
    processes = []

    def start(spec):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        processes.append(process)
        return supervision.PopenRank(spec, process)

    spec = RankSpec(role="worker", index=0, host=0, local_rank=0)
    result = supervision.supervise([spec], start, grace=1.0, out=io.BytesIO(), err=io.BytesIO())
    assert result.exit_code == supervision.EXIT_INTERRUPTED, result.message
    assert len(starts) == 2 and all(p.poll() is not None for p in processes)
