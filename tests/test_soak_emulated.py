"""A soak: a PS job on the emulated cluster under a mixed schedule of faults and hostile clients.

During the job, switch ports of its hosts go down and up (1-3 s), a worker is paused with
SIGSTOP/SIGCONT (3 s, below the transport timeout) every 20 s, and a hostile client inside a host of the
cluster sends generated frames (tests/test_fuzz_volume.py) to the parameter server without pause. Every
rank's resident memory and thread count are sampled: they must stay within a stated bound. The loss
curve must equal a calm run's of the same job bit for bit, and nothing may be left behind.

The suite runs it shortened (GERYON_SOAK_S, default 20 s of faults); the documented full run is
`GERYON_SOAK_S=600 .venv/bin/python -m pytest tests/test_soak_emulated.py -s -o timeout=3000`.
"""

import inspect
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launch_support import (EXAMPLE, BackgroundLaunch, clean_env, json_records, loss_curve, rank_lines, start_launcher)
from test_faults_emulated import Flapper
from test_fuzz_volume import _continuation, _header, generated_frame

from geryon.transport.wire import CONTINUATION, CONTINUATION_TAG, HEADER, MAGIC, PROTOCOL_VERSION, Kind


pytestmark = [pytest.mark.root, pytest.mark.slow]

SOAK_S = float(os.environ.get("GERYON_SOAK_S", "20"))
ITERATIONS_PER_S = 10             # calm training speed here, roughly: the job lasts about SOAK_S
TIMEOUT_S = 30                     # TCP backoff after back-to-back outages on one host can exceed 12 s
THREAD_BOUND = 64 + 8 + 40        # handshakes in flight + per-source slack + the rank's own threads
RSS_GROWTH_BOUND = 150 << 20      # bytes a rank may grow over its first sample

# stdlib only (no torch import: it would take seconds); the generator is test_fuzz_volume's own code,
# the wire's constants are written in from geryon.transport.wire
FUZZ_PRELUDE = f"""
import random, socket, struct, sys, time
HEADER, MAGIC, PROTOCOL_VERSION = struct.Struct({HEADER.format!r}), {MAGIC!r}, {PROTOCOL_VERSION}
CONTINUATION, CONTINUATION_TAG = struct.Struct({CONTINUATION.format!r}), {CONTINUATION_TAG!r}
Kind = {[int(kind) for kind in Kind]}
"""
FUZZ_LOOP = """
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng, sent, end = random.Random(7), 0, time.monotonic() + seconds
while time.monotonic() < end:     # the cluster's teardown may kill it: the count is printed as it goes
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(generated_frame(rng))
        sent += 1
        if sent % 20 == 0:
            print("fuzz frames", sent, flush=True)
    except OSError:
        time.sleep(0.05)
"""


def fuzz_client() -> str:
    return (FUZZ_PRELUDE + inspect.getsource(_header) + inspect.getsource(_continuation)
            + inspect.getsource(generated_frame) + FUZZ_LOOP)


def _args():
    iterations = max(40, int(SOAK_S * ITERATIONS_PER_S))
    return ["--emulate", "--bw", "1gbit", "--workers", "2", "--mode", "ps", "--servers", "1", "--policy",
            "geryon", "--timeout", str(int(SOAK_S * 6 + 300)), EXAMPLE, "--iterations", str(iterations),
            "--width", "4", "--train-size", "512", "--test-size", "100", "--log-json"]


def _status(pid: int) -> tuple[int, int] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss, threads = re.search(r"VmRSS:\s+(\d+)", text), re.search(r"Threads:\s+(\d+)", text)
    if rss is None or threads is None:        # exiting: no memory left to count
        return None
    return int(rss.group(1)) * 1024, int(threads.group(1))


def test_soak_with_mixed_faults_and_hostile_clients():
    env = clean_env(GERYON_TRANSPORT_TIMEOUT=str(TIMEOUT_S))
    # the calm run of the same job trains on its own emulated cluster while the soak runs on this one
    calm_run = BackgroundLaunch(*_args(), env=env)
    launcher = start_launcher(*_args(), env=env)
    flapper, fuzzer = None, None
    stop = threading.Event()
    samples: dict[int, list[tuple[float, int, int]]] = {}
    try:
        job = launcher.stderr.readline().split()[2].rstrip(":")
        lines = []
        server_address = None
        while server_address is None:
            line = launcher.stdout.readline()
            assert line, launcher.stderr.read()
            lines.append(line)
            found = re.search(r"\[server0\].* on (\S+):(\d+)", line)
            if found:
                server_address = found.group(1), found.group(2)
        ranks = {name: int(pids.split()[0]) for name in ("h1", "h2", "h3")
                 if (pids := subprocess.run(["ip", "netns", "pids", f"gy{job}-{name}"], capture_output=True,
                                            text=True).stdout)}
        fuzzer = subprocess.Popen(["ip", "netns", "exec", f"gy{job}-h1", sys.executable, "-c",
                                   fuzz_client(),
                                   *server_address, str(SOAK_S)], stdout=subprocess.PIPE, text=True)
        fuzz_lines: list[str] = []      # read as it goes: a full pipe would stop the client mid-soak
        drain = threading.Thread(target=lambda: fuzz_lines.extend(fuzzer.stdout), daemon=True)
        drain.start()
        flapper = Flapper(job, ["h1", "h2", "h3"])
        flapper.start()

        def sample():
            started = time.monotonic()
            while not stop.is_set():
                for pid in ranks.values():
                    status = _status(pid)
                    if status:
                        samples.setdefault(pid, []).append((time.monotonic() - started, *status))
                if int(time.monotonic() - started) % 20 == 10 and "h2" in ranks:
                    try:
                        os.kill(ranks["h2"], signal.SIGSTOP)    # worker 1 pauses below the timeout
                        stop.wait(3.0)
                        os.kill(ranks["h2"], signal.SIGCONT)
                    except ProcessLookupError:
                        return                                  # the job has ended
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        faults_started = time.monotonic()
        out, err = launcher.communicate(timeout=SOAK_S * 6 + 300)
        faulty_s = time.monotonic() - faults_started
        stop.set()
        flapper.stop.set()
        flapper.join(10)
        sampler.join(10)
        fuzzer.wait(timeout=SOAK_S + 30)
        drain.join(10)
        assert fuzz_lines, "the hostile client sent nothing"
        assert launcher.returncode == 0, err[-3000:]
        calm = calm_run.result(timeout=SOAK_S * 6 + 300)
        assert calm.returncode == 0, calm.stderr[-3000:]
        calm_curve = loss_curve(json_records(rank_lines(calm.stdout, "worker0")))
        records = json_records(rank_lines("".join(lines) + out, "worker0"))
        assert loss_curve(records) == calm_curve, "the soak changed the training (not bit for bit)"
        for pid, series in samples.items():
            assert max(s[2] for s in series) <= THREAD_BOUND, (pid, series)
            assert max(s[1] for s in series) - series[0][1] <= RSS_GROWTH_BOUND, (pid, series)
        print(f"soak: {faulty_s:.0f} s of training under faults, {flapper.outages} outages, "
              f"{fuzz_lines[-1].strip()}, "
              f"peak threads {max(s[2] for v in samples.values() for s in v)}, "
              f"peak RSS growth {max(max(s[1] for s in v) - v[0][1] for v in samples.values()) >> 20} MiB")
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"gy{job}-" not in listing, "the job's cluster was left behind"
        assert not any(_status(pid) for pid in ranks.values()), "ranks were left running"
    finally:
        stop.set()
        if flapper is not None:
            flapper.stop.set()
        for pid in ranks.values() if "ranks" in locals() else ():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        launcher.kill()
        launcher.wait()
        calm_run.stop()
        if fuzzer is not None and fuzzer.poll() is None:
            fuzzer.kill()
            fuzzer.wait()
