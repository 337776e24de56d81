"""Real training over geryon's transport (local backend): a dead worker, a dead server or Ctrl-C mid-training
ends the job with a clear message and leaves no process behind; servers never hang on a lost worker."""

import os
import shutil
import signal
import time

import pytest

from launch_support import EXAMPLE, clean_env, job_id, pids_of_job, rank_pid, start_launcher

RANK_START = "exec"   # finds ranks by their environment (/proc/PID/environ): tests/conftest.py

pytestmark = pytest.mark.slow

LONG_TRAINING = ["--iterations", "100000", "--width", "4", "--train-size", "512", "--test-size", "100",
                 "--log-every", "1"]


@pytest.fixture
def training(tmp_path):
    """Start a long PS training (2 workers, 1 server); yields (launcher, job id) once it iterates."""
    script = tmp_path / "train_cnn.py"
    shutil.copy(EXAMPLE, script)
    started = []

    def start(*extra):
        launcher = start_launcher("--local", "--mode", "ps", "--workers", "2", "--servers", "1",
                                  "--grace", "2", *extra, script, *LONG_TRAINING,
                                  env=clean_env(GERYON_TRANSPORT_TIMEOUT="5"))
        started.append(launcher)
        job = job_id(launcher.stderr.readline())
        for line in launcher.stdout:
            if line.startswith("[worker0] iteration"):
                return launcher, job
        raise AssertionError(f"training never started: {launcher.stderr.read()[-3000:]}")

    yield start
    for launcher in started:
        launcher.kill()
        launcher.wait()


def _end(launcher, job):
    _out, err = launcher.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while pids_of_job(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_of_job(job) == [], f"leftover processes of job {job}"
    return err


def test_killed_worker_ends_training(training):
    launcher, job = training()
    os.kill(rank_pid(launcher.pid, "worker1"), signal.SIGKILL)
    err = _end(launcher, job)
    assert launcher.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert "worker1 was killed by SIGKILL" in err


def test_killed_server_ends_training(training):
    launcher, job = training()
    os.kill(rank_pid(launcher.pid, "server0"), signal.SIGKILL)
    err = _end(launcher, job)
    assert launcher.returncode != 0, err[-3000:]
    assert "server0 was killed by SIGKILL" in err or "server 0" in err, err[-3000:]


def test_ctrl_c_ends_training(training):
    launcher, job = training()
    launcher.send_signal(signal.SIGINT)
    err = _end(launcher, job)
    assert launcher.returncode == 130, err[-3000:]
    assert "interrupted" in err


def test_worker_leaving_mid_job_ends_it(tmp_path):
    """A worker exits after one step while the other waits for parameters: the job ends, no hang."""
    script = tmp_path / "die.py"
    script.write_text(
        "import os, sys, torch, geryon\n"
        "geryon.init()\n"
        "model = torch.nn.Linear(4, 2)\n"
        "model, opt = geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "model(torch.zeros(1, 4)).sum().backward(); opt.step()\n"
        "print('stepped', flush=True)\n"
        "if os.environ['RANK'] == '1':\n"
        "    os._exit(3)\n"
        "model(torch.zeros(1, 4))\n")
    launcher = start_launcher("--local", "--mode", "ps", "--workers", "2", "--servers", "1", "--grace", "2",
                              script, env=clean_env(GERYON_TRANSPORT_TIMEOUT="3"))
    try:
        job = job_id(launcher.stderr.readline())
        err = _end(launcher, job)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 3, err[-3000:]
    assert "worker1 failed with exit code 3" in err
