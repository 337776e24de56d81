"""Trace a stall of the flapping-links job: the PS case of test_faults_emulated.py, watched.

    sudo .venv/bin/python tests/flapping_probe.py OUT_DIR [--seed N] [--timeout S] [--stall S]

Runs the PS job of tests/test_faults_emulated.py (emulated cluster, 1 Gbit/s, 2 workers, 1 server,
1000 iterations) under the same faults (switch ports of h1-h3 down 1-5 s, up 2-3 s; worker 1 paused
3 s once) without the calm run before it. When worker 0 prints no iteration for --stall seconds it writes
OUT_DIR/stall.txt: every host's TCP connections (`ss -tinoem`: retransmission timeout, backoff, queues),
links and neighbours, and every rank's thread stacks with their locals (py-spy, from the venv), while the
stall lasts. OUT_DIR/events.log times the faults; OUT_DIR/stdout.txt and stderr.txt are the launcher's.
Prints one JSON line: exit status, whether a stall was seen, the largest pause between two of worker
0's iterations, seconds. Needs root (network namespaces).
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from launch_support import EXAMPLE, clean_env, start_launcher

HOSTS = ("h1", "h2", "h3")           # worker 0, worker 1, the server
ARGS = ["--iterations", "1000", "--width", "4", "--train-size", "512", "--test-size", "100",
        "--global-batch-size", "64", "--log-json"]
PY_SPY = Path(sys.executable).with_name("py-spy")
TIME_S = re.compile(r'"iteration": (\d+),.*"time_s": ([0-9.]+)')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--timeout", type=float, default=12.0, help="the transport timeout (s)")
    parser.add_argument("--stall", type=float, default=9.0, help="seconds without an iteration = a stall")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    events = open(args.out / "events.log", "w")

    def event(text: str) -> None:
        events.write(f"{time.monotonic() - started:8.2f} {text}\n")
        events.flush()

    launcher = start_launcher("--emulate", "--bw", "1gbit", "--workers", "2", "--policy", "geryon",
                              "--timeout", "900", "--mode", "ps", "--servers", "1", EXAMPLE, *ARGS,
                              env=clean_env(GERYON_TRANSPORT_TIMEOUT=str(args.timeout)))
    job = launcher.stderr.readline().split()[2].rstrip(":")
    event(f"job {job}")
    lines, errors, last = [], [], {"at": time.monotonic(), "iteration": None}

    def read_stdout() -> None:
        for line in launcher.stdout:
            lines.append(line)
            found = TIME_S.search(line) if line.startswith("[worker0") else None
            if found:
                last["at"], last["iteration"] = time.monotonic(), int(found.group(1))

    threading.Thread(target=read_stdout, daemon=True).start()
    threading.Thread(target=lambda: errors.extend(launcher.stderr), daemon=True).start()
    while last["iteration"] is None and launcher.poll() is None:
        time.sleep(0.1)
    pids = {host: subprocess.run(["ip", "netns", "pids", f"gy{job}-{host}"], capture_output=True,
                                 text=True).stdout.split() for host in HOSTS}
    stop = threading.Event()
    threading.Thread(target=flap, args=(job, pids["h2"], random.Random(args.seed), stop, event),
                     daemon=True).start()
    stalled = False
    while launcher.poll() is None:
        time.sleep(0.5)
        if not stalled and last["iteration"] != 999 and time.monotonic() - last["at"] > args.stall:
            stalled = True
            event(f"stall: no iteration for {args.stall:g} s after iteration {last['iteration']}")
            (args.out / "stall.txt").write_text(snapshot(job, pids))
    stop.set()
    (args.out / "stdout.txt").write_text("".join(lines))
    (args.out / "stderr.txt").write_text("".join(errors))
    times = [float(t) for _, t in TIME_S.findall("".join(line for line in lines if line.startswith("[worker0")))]
    pause = max((b - a for a, b in zip(times, times[1:])), default=0.0)
    print(json.dumps({"rc": launcher.returncode, "stall": stalled, "iterations": len(times),
                      "largest_pause_s": round(pause, 2), "seconds": round(time.monotonic() - started)}))
    return 0 if launcher.returncode == 0 and not stalled else 1


def flap(job: str, worker1, rng: random.Random, stop: threading.Event, event) -> None:
    """tests/test_faults_emulated.py's Flapper, with each fault logged."""
    paused = False
    while not stop.is_set():
        host = rng.choice(HOSTS)
        if not _port(job, host, "down"):
            return
        event(f"down {host}")
        stop.wait(rng.uniform(1.0, 5.0))
        if not _port(job, host, "up"):
            return
        event(f"up {host}")
        if not paused and worker1 and not stop.wait(3.0):
            paused = True
            os.kill(int(worker1[0]), signal.SIGSTOP)
            event("worker 1 paused")
            stop.wait(3.0)
            os.kill(int(worker1[0]), signal.SIGCONT)
            event("worker 1 resumed")
        stop.wait(rng.uniform(2.0, 3.0))


def _port(job: str, host: str, state: str) -> bool:
    return subprocess.run(["ip", "-n", f"gy{job}-sw", "link", "set", host, state],
                          capture_output=True).returncode == 0


def snapshot(job: str, pids) -> str:
    """Every host's TCP state, links and neighbours, and every rank's stacks, as text."""
    def run(*argv) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout

    parts = []
    for host in (*HOSTS, "sw"):
        parts += [f"===== {host}: ss -tinoem", run("ip", "netns", "exec", f"gy{job}-{host}", "ss", "-tinoem"),
                  run("ip", "-n", f"gy{job}-{host}", "-s", "link"), run("ip", "-n", f"gy{job}-{host}", "neigh")]
    for host, ranks in pids.items():
        for pid in ranks:
            parts += [f"===== {host}: py-spy dump --pid {pid}", run(str(PY_SPY), "dump", "--pid", pid, "--locals")]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
