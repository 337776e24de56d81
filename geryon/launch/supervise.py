"""Supervision of a job's ranks, whatever started them: stream, watch, stop.

Backends start ranks and hand back `RankProcess` handles; `supervise` streams each rank's output
with a `[worker0] ` prefix, and ends the job when all workers have exited 0 (servers are then
stopped), when a rank fails (a non-zero exit, or a server that quits while workers still run), on
timeout, or on Ctrl-C / SIGTERM to the launcher (a KeyboardInterrupt). Stopping is always the same:
SIGTERM to every rank's process group, SIGKILL after the grace period, then the output is drained.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Protocol

from geryon.errors import LaunchError
from geryon.launch.placement import RankSpec
from geryon.signals import interrupts_deferred

POLL_INTERVAL_S = 0.05
TAIL_LINES = 15
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130


class RankProcess(Protocol):
    """A started rank, as any backend sees it."""

    spec: RankSpec
    stdout: BinaryIO | None
    stderr: BinaryIO | None

    def poll(self) -> int | None:
        """Exit code once it has exited (negative: killed by that signal), else None."""

    def signal(self, signum: int) -> None:
        """Send `signum` to the rank and every process it started; no error if they are gone."""


class PopenRank:
    """A rank that is a child process started in its own session (local and emulated backends)."""

    def __init__(self, spec: RankSpec, process: subprocess.Popen):
        self.spec = spec
        self.process = process
        self.stdout = process.stdout
        self.stderr = process.stderr

    def poll(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        signal_group(self.process.pid, signum)


def signal_group(leader: int, signum: int) -> None:
    """`signum` to the process group of `leader`, a rank started in its own session: the rank and every
    process it started. The group outlives its leader while members remain, so this also reaches
    grandchildren of a rank that already exited (the kernel does not reuse a live PGID); no error if
    they are all gone."""
    try:
        os.killpg(leader, signum)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class JobResult:
    """How a job ended: the launcher's exit code, a one-line reason, and the failed rank's last lines."""

    exit_code: int
    message: str
    failed_rank: str | None = None
    tail: tuple[str, ...] = ()
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class OutputPump(threading.Thread):
    """Copies one stream of one rank to the launcher's stream, line by line, with the rank's prefix."""

    def __init__(self, stream: BinaryIO, prefix: bytes, sink: BinaryIO, lock: threading.Lock):
        super().__init__(daemon=True, name=f"pump-{prefix.decode().strip()}")
        self.stream, self.prefix, self.sink, self.lock = stream, prefix, sink, lock
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        try:
            for line in iter(self.stream.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                self.tail.append(line.decode(errors="replace").rstrip("\n"))
                with self.lock:
                    self.sink.write(self.prefix + line)
                    self.sink.flush()
        except (OSError, ValueError, EOFError):  # the stream was closed under us while stopping
            pass


def supervise(specs: list[RankSpec], start: Callable[[RankSpec], RankProcess], grace: float,
              timeout: float | None = None, out: BinaryIO | None = None,
              err: BinaryIO | None = None) -> JobResult:
    """Start every rank with `start`, watch them to the end of the job, stop them all, report."""
    out = out or sys.stdout.buffer
    err = err or sys.stderr.buffer
    lock = threading.Lock()
    ranks: list[RankProcess] = []
    pumps: dict[str, list[OutputPump]] = {}
    started = time.monotonic()
    try:
        for spec in specs:
            rank = start(spec)
            ranks.append(rank)
            prefix = f"[{spec.name}] ".encode()
            pumps[spec.name] = []     # only started pumps are listed: Ctrl-C may land between two starts
            for stream, sink in ((rank.stderr, err), (rank.stdout, out)):
                if stream:
                    pump = OutputPump(stream, prefix, sink, lock)
                    pump.start()
                    pumps[spec.name].append(pump)
        result = _watch(ranks, timeout, started)
    except KeyboardInterrupt:
        result = JobResult(EXIT_INTERRUPTED, "interrupted: stopped all ranks")
    finally:
        with interrupts_deferred():
            stragglers = stop_ranks(ranks, grace)
            for pump in (p for group in pumps.values() for p in group):
                pump.join(timeout=2.0)
    if stragglers:
        raise LaunchError(f"could not stop {', '.join(stragglers)} even with SIGKILL")
    if pumps.get(result.failed_rank):
        stderr_pump = pumps[result.failed_rank][0]
        result.tail = tuple(stderr_pump.tail or pumps[result.failed_rank][-1].tail)
    result.elapsed_s = time.monotonic() - started
    return result


def _watch(ranks: list[RankProcess], timeout: float | None, started: float) -> JobResult:
    workers = [r for r in ranks if r.spec.role == "worker"]
    while True:
        workers_running = False
        failed = []
        for rank in ranks:
            code = rank.poll()
            if code is None:
                workers_running |= rank.spec.role == "worker"
            elif code != 0:
                failed.append((rank, code))
        if failed:   # seen at once: the first to end where the backend knows the order (forked ranks)
            rank, code = min(failed, key=lambda item: getattr(item[0], "exit_order", 0))
            return _failure(rank.spec.name, code)
        for rank in ranks:
            if rank.spec.role == "server" and rank.poll() == 0 and workers_running:
                return JobResult(1, f"{rank.spec.name} exited while workers were still running",
                                 failed_rank=rank.spec.name)
        if workers and not workers_running:
            return JobResult(0, f"all {len(workers)} workers finished")
        if timeout is not None and time.monotonic() - started > timeout:
            return JobResult(EXIT_TIMEOUT, f"timed out after {timeout:g} s: stopped all ranks")
        time.sleep(POLL_INTERVAL_S)


def _failure(name: str, code: int) -> JobResult:
    if code < 0:
        try:
            signame = signal.Signals(-code).name
        except ValueError:
            signame = f"signal {-code}"
        return JobResult(128 - code, f"{name} was killed by {signame}", failed_rank=name)
    return JobResult(code, f"{name} failed with exit code {code}", failed_rank=name)


def stop_ranks(ranks: list[RankProcess], grace: float) -> list[str]:
    """SIGTERM every rank's group, SIGKILL what is left after `grace` s; return ranks still alive."""
    for rank in ranks:
        rank.signal(signal.SIGTERM)
    _wait_all(ranks, grace)
    for rank in ranks:  # also reaches leftover children of ranks that did exit
        rank.signal(signal.SIGKILL)
    _wait_all(ranks, 5.0)
    return [r.spec.name for r in ranks if r.poll() is None]


def _wait_all(ranks: list[RankProcess], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(r.poll() is None for r in ranks) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
