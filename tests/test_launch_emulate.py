"""The emulated-cluster backend: training matches one process, and the job's cluster always goes away."""

import signal
import subprocess
import time

import pytest

from geryon.emulate.clean import clean

from launch_support import (EXAMPLE, EXAMPLE_ARGS, assert_no_processes, job_id, json_records, loss_curve,
                            marker, rank_lines, run_launcher, start_launcher)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def namespaces_of(job: str) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"gy{job}-")]


@pytest.mark.parametrize("mode_args", [["--mode", "ps", "--servers", "2", "--policy", "geryon"],
                                       ["--mode", "allreduce", "--policy", "geryon"]], ids=["ps", "allreduce"])
def test_training_on_emulated_cluster_matches_single_process(single_curve, mode_args):
    result = run_launcher("--emulate", "--bw", "1gbit", "--workers", "2", *mode_args, EXAMPLE, *EXAMPLE_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "emulated star cluster" in result.stderr
    records = json_records(rank_lines(result.stdout, "worker0"))
    assert records[-1]["mode"] == mode_args[1]
    assert loss_curve(records) == pytest.approx(single_curve, rel=1e-4, abs=1e-5)
    if mode_args[1] == "ps":  # both servers ran geryon's ParameterServer
        for server in ("server0", "server1"):
            assert any("serving" in line for line in rank_lines(result.stdout, server)), result.stdout[-2000:]
    assert namespaces_of(job_id(result.stderr)) == []


def test_ctrl_c_removes_the_cluster(tmp_path):
    word = marker()
    script = tmp_path / "wait.py"
    script.write_text("import os, sys, time\nprint('ready', os.environ['GERYON_HOST_IP'], flush=True)\n"
                      "time.sleep(300)\n")
    launcher = start_launcher("--emulate", "--workers", "2", "--grace", "1", script, word)
    job = None
    try:
        banner = launcher.stderr.readline()
        job = banner.split()[2].rstrip(":")
        first = launcher.stdout.readline()
        assert first.startswith("[worker"), (banner, first, launcher.stderr.read())  # a rank runs
        assert len(namespaces_of(job)) == 3  # two hosts and the switch
        launcher.send_signal(signal.SIGINT)
        _out, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, err
    finally:
        launcher.kill()
        launcher.wait()
        if job is not None and namespaces_of(job) and launcher.returncode != 130:
            clean(name=job)   # the launcher failed (killed above): remove its cluster, then fail below
    deadline = time.monotonic() + 10
    while namespaces_of(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert namespaces_of(job) == []
    assert_no_processes(word)


def test_a_failing_job_restarts_on_a_fresh_cluster_then_gives_up(tmp_path):
    """--max-restarts on the emulated backend: each start gets its own cluster, removed after it."""
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('start', os.environ['GERYON_RESTART_COUNT'], flush=True)\nsys.exit(3)\n")
    result = run_launcher("--emulate", "--workers", "1", "--max-restarts", "1", script, timeout=120)
    assert result.returncode == 3, result.stderr[-3000:]
    assert rank_lines(result.stdout, "worker0") == ["start 0", "start 1"]
    assert "error: worker0 failed with exit code 3; gave up after 1 restart (after" in result.stderr
    assert namespaces_of(job_id(result.stderr)) == []
