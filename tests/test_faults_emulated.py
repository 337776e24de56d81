"""Faults a training job lives through on the emulated cluster: flapping links, a paused rank.

While a PS or allreduce job trains, the switch ports of its hosts go down and up (outages of 1-5 s,
repeatedly) and a worker is paused with SIGSTOP/SIGCONT for less than the transport timeout: the job
finishes and its loss curve equals single-process training on the same batches. An outage longer than
the transport timeout ends the job within the timeout with an error naming the unreachable peer.
"""

import os
import random
import signal
import subprocess
import threading
import time

import pytest

from launch_support import (EXAMPLE, BackgroundLaunch, clean_env, json_records, loss_curve, rank_lines,
                            run_single_process, start_launcher)

pytestmark = [pytest.mark.root, pytest.mark.slow]

# 1000 iterations (~20 s of training on a quiet machine): long enough for >= 3 outages however fast it runs
ARGS = ["--iterations", "1000", "--width", "4", "--train-size", "512", "--test-size", "100",
        "--global-batch-size", "64", "--log-json"]  # one process and 2 workers: the same global batch
# every fault stays below it with margin: an outage (<= 5 s) plus the capped retransmission backoff (1 s,
# TCP_RTO_MAX_MS on geryon's flows and on the workers' gloo connections, which carry the logged loss every
# iteration) plus a loaded CI machine; the pause comes only once the links are up.
TIMEOUT_S = 12


def _port(job: str, host: str, state: str) -> None:
    subprocess.run(["ip", "-n", f"gy{job}-sw", "link", "set", host, state], check=True)


class Flapper(threading.Thread):
    """Takes the switch ports of `hosts` down for 1-5 s, up for 2-3 s, until stopped; pauses a rank once.

    The pause (3 s) follows an outage only after the links have been up for 3 s, and a link stays up at
    least 2 s between outages (TCP's capped backoff, 1 s, to resend, then time to move), so no two faults
    add up to one long silence: each fault alone stays below the transport timeout. With up times of
    1-2 s, an outage, a 1 s up time without a resend and a second outage once made one 10.4 s silence.
    """

    def __init__(self, job: str, hosts: list[str], pause_pid=None, seed: int = 13):
        super().__init__(daemon=True)
        self.job, self.hosts, self.pause_pid = job, hosts, pause_pid
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.outages = 0

    def run(self):
        paused = False
        while not self.stop.is_set():
            host = self.random.choice(self.hosts)
            try:
                _port(self.job, host, "down")
            except subprocess.CalledProcessError:
                return                                    # the cluster is gone: the job ended
            self.outages += 1
            self.stop.wait(self.random.uniform(1.0, 5.0))
            try:
                _port(self.job, host, "up")
            except subprocess.CalledProcessError:
                return
            if not paused and self.pause_pid is not None and not self.stop.wait(3.0):
                paused = True
                try:
                    os.kill(self.pause_pid, signal.SIGSTOP)
                    self.stop.wait(3.0)
                finally:
                    try:
                        os.kill(self.pause_pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            self.stop.wait(self.random.uniform(2.0, 3.0))


def _first_line(launcher, lines: list[str], name: str) -> str:
    while True:
        line = launcher.stdout.readline()
        assert line, launcher.stderr.read()
        lines.append(line)
        if line.startswith(f"[{name}"):
            return line


@pytest.fixture(scope="module")
def single_curve():
    return loss_curve(run_single_process(*ARGS, "--iterations", "20"))  # the last --iterations wins


def _launch_args(mode_args):
    return ["--emulate", "--bw", "1gbit", "--workers", "2", "--policy", "geryon", "--timeout", "400",
            *mode_args, EXAMPLE, *ARGS]


@pytest.mark.parametrize("mode_args", [["--mode", "ps", "--servers", "1"], ["--mode", "allreduce"]],
                         ids=["ps", "allreduce"])
def test_training_survives_flapping_links_and_a_paused_rank(single_curve, mode_args, tmp_path):
    env = clean_env(GERYON_TRANSPORT_TIMEOUT=str(TIMEOUT_S))
    # the calm run of the same job trains on its own emulated cluster while the faults hit this one
    calm_run = BackgroundLaunch(*_launch_args(mode_args), env=env)
    launcher = start_launcher(*_launch_args(mode_args), env=env)
    flapper = None
    try:
        banner = launcher.stderr.readline()
        job = banner.split()[2].rstrip(":")
        lines = []
        _first_line(launcher, lines, "worker")               # training has started
        pids = subprocess.run(["ip", "netns", "pids", f"gy{job}-h2"], capture_output=True,
                              text=True).stdout.split()
        worker1 = int(pids[0]) if pids else None
        hosts = ["h1", "h2", "h3"] if mode_args[1] == "ps" else ["h1", "h2"]
        flapper = Flapper(job, hosts, pause_pid=worker1)
        flapper.start()
        out, err = launcher.communicate(timeout=400)
        flapper.stop.set()
        flapper.join(10)
        assert launcher.returncode == 0, err[-3000:]
        assert flapper.outages >= 3, f"only {flapper.outages} outages happened during training"
        calm = calm_run.result(timeout=400)
        assert calm.returncode == 0, calm.stderr[-3000:]
        calm_curve = loss_curve(json_records(rank_lines(calm.stdout, "worker0")))
        # the exactness tests' tolerance holds for the first iterations; later, float rounding drifts apart
        assert calm_curve[:20] == pytest.approx(single_curve[:20], rel=1e-4, abs=1e-5)
        records = json_records(rank_lines("".join(lines) + out, "worker0"))
        assert loss_curve(records) == calm_curve, "faults changed the training (not bit for bit)"
    finally:
        if flapper is not None:
            flapper.stop.set()
        launcher.kill()
        launcher.wait()
        calm_run.stop()


@pytest.mark.timing
def test_outage_longer_than_the_timeout_names_the_peer(tmp_path):
    timeout = 4
    env = clean_env(GERYON_TRANSPORT_TIMEOUT=str(timeout))
    args = ["--iterations", "400", "--width", "4", "--train-size", "512", "--test-size", "100", "--log-json"]
    launcher = start_launcher("--emulate", "--bw", "1gbit", "--workers", "2", "--mode", "ps", "--servers", "1",
                              "--grace", "1", EXAMPLE, *args, env=env)
    try:
        banner = launcher.stderr.readline()
        job = banner.split()[2].rstrip(":")
        lines = []
        _first_line(launcher, lines, "worker")
        for _ in range(3):
            lines.append(launcher.stdout.readline())
        _port(job, "h3", "down")                           # the server's host vanishes for good
        cut = time.monotonic()
        out, err = launcher.communicate(timeout=120)
        ended = time.monotonic() - cut
        assert launcher.returncode != 0
        assert ended < timeout + 15, f"the job took {ended:.1f} s to end after the outage"
        text = "".join(lines) + out + err
        assert "10.199." in text and ("PeerTimeout" in text or "no progress" in text or "stalled" in text), \
            text[-3000:]
    finally:
        launcher.kill()
        launcher.wait()
