"""Role subprocesses: a module started with its argv (here, in a network namespace, or in an emulated host),
its stdout read line by line as JSON records, a crash or a timeout turned into a typed error.

Every child geryon starts and talks to over stdout goes through `ChildProcess`: the transport and replay
benchmark roles (geryon.bench), the emulator's traffic processes (geryon.emulate.check) and the DSCP
sniffer (geryon.netconf.verify). The caller names the error class (`error=`: NetconfError for the
sniffer, EmulationError for traffic, TransportError for transport roles), so a failure keeps its
layer's type; every message names the child, its exit status and the tail of its stderr.

    child = ChildProcess.start(module_argv("geryon.bench.transport_roles", "allreduce", ...),
                               netns="gyb1234h1", error=TransportError)
    records = child.finish(timeout=600)          # every JSON line, once it exited 0

`child_env()` puts the directory that holds the `geryon` package on PYTHONPATH, so a child started
with `ip netns exec` or `nsenter` imports the same geryon as its parent, installed or not, and turns on
Python's faulthandler there: a child that runs past its timeout, or says nothing within one, is sent
SIGABRT first, so the error shows where each of its threads was stuck (then it is killed).
"""

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from geryon.errors import GeryonError
from geryon.netnames import netns_path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
_EOF = object()
STACKS_CHARS = 4000  # stderr shown when a hung child was aborted: its threads' stacks


def module_argv(module: str, *args) -> list[str]:
    """`python -u -m module args...` with this interpreter."""
    return [sys.executable, "-u", "-m", module, *map(str, args)]


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """`argv` run inside network namespace `netns` (nsenter execs it: the PID stays the command's)."""
    if not netns:
        return list(map(str, argv))
    return ["nsenter", f"--net={netns_path(netns)}", "--", *map(str, argv)]


def child_env(extra: dict | None = None) -> dict[str, str]:
    """This process's environment, with geryon's package root first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
    env.setdefault("PYTHONFAULTHANDLER", "1")  # stacks on SIGABRT: see ChildProcess.finish
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class ChildProcess:
    """One started child: its stdout lines in a queue (read by a thread), its stderr in a file."""

    def __init__(self, process: subprocess.Popen, name: str, error: type[GeryonError], stderr_file):
        self.process, self.name, self.error = process, name, error
        self._stderr = stderr_file
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def start(cls, argv: list, *, netns: str | None = None, env: dict | None = None, interactive: bool = False,
              name: str | None = None, error: type[GeryonError] = GeryonError,
              stderr_path: str | None = None) -> "ChildProcess":
        """Start `argv` (in `netns` when given) with `env` (default `child_env()`).

        `interactive`: stdin is a pipe for `send()`; else it is /dev/null. `stderr_path`: keep the
        child's stderr there (default: a temporary file removed when the child is reaped).
        """
        argv = in_netns(netns, argv)
        if stderr_path:
            open(stderr_path, "w").close()
        # append mode: the child's writes never land at an offset a stderr_tail() read moved
        stderr = open(stderr_path, "a+") if stderr_path else tempfile.TemporaryFile("a+")
        try:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE if interactive else subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1,
                                       env=child_env() if env is None else env)
        except OSError as exc:
            stderr.close()
            raise error(f"could not start {name or argv[0]}: {exc}") from None
        return cls(process, name or _describe(argv), error, stderr)

    # -- reading -------------------------------------------------------------------------------
    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(_EOF)

    def next_line(self, timeout: float) -> str:
        """The next stdout line; `error` if none comes within `timeout` s (the child is then aborted, for its
        stacks) or the child exits first."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self._abort_for_stacks()
            stacks = self.stderr_tail(STACKS_CHARS)
            raise self.error(f"{self.name} said nothing within {timeout:g} s: {stacks}") from None
        if line is _EOF:
            self._lines.put(_EOF)
            raise self.error(f"{self.name} exited ({self.process.wait()}): {self.stderr_tail()}")
        return line

    def next_record(self, timeout: float) -> dict:
        """The next JSON line (other lines are skipped)."""
        while True:
            line = self.next_line(timeout)
            if line.startswith("{"):
                return self._parse(line)

    def finish(self, timeout: float) -> list[dict]:
        """Wait for the child to exit; every JSON line it printed. `error` on a timeout or a non-zero exit."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._abort_for_stacks()
            self.kill()
            raise self.error(f"{self.name} ran past {timeout:g} s: {self.stderr_tail(STACKS_CHARS)}") from None
        records = []
        while True:
            line = self._lines.get()
            if line is _EOF:
                break
            if line.startswith("{"):
                records.append(self._parse(line))
        if self.process.returncode != 0:
            raise self.error(f"{self.name} exited {self.process.returncode}: {self.stderr_tail()}")
        return records

    def _parse(self, line: str) -> dict:
        try:
            return json.loads(line)
        except ValueError:
            raise self.error(f"{self.name} printed a broken JSON line {line[:200]!r}") from None

    # -- writing and stopping --------------------------------------------------------------------
    def send(self, record: dict) -> None:
        """One JSON line on the child's stdin (started with interactive=True)."""
        try:
            self.process.stdin.write(json.dumps(record) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self.error(f"{self.name} is gone: {self.stderr_tail()}") from None

    def _abort_for_stacks(self, wait: float = 2.0) -> None:
        """SIGABRT a hung child: a Python child with faulthandler on writes every thread's stack to stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                pass

    def stderr_tail(self, chars: int = 800) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            return self._stderr.read()[-chars:].strip() or "(no stderr)"
        except (OSError, ValueError):
            return "(no stderr)"

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def close(self) -> None:
        """Reap the child (killed if still running) and release its files."""
        self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._stderr.close()


def finish_all(children: list[ChildProcess], timeout: float, grace: float = 3.0) -> list[list[dict]]:
    """Every child's JSON records, waiting for all of them within one deadline.

    When a child fails, the others get `grace` s to end on their own (a peer's failure usually ends
    them too), then every child still running is killed. The error raised is the failure seen first
    in time (the root cause, not the first child in the list), and it names the others that failed.
    """
    deadline = time.monotonic() + timeout
    try:
        failed = _failures_in_order(children, deadline, grace)
        if failed:
            first, others = failed[0], failed[1:]
            also = f" (then {'; '.join(f'{c.name} exited {c.process.returncode}' for c in others)})" if others else ""
            raise first.error(f"{first.name} exited {first.process.returncode} first: {first.stderr_tail()}{also}")
        return [child.finish(max(1.0, deadline - time.monotonic())) for child in children]
    finally:
        for child in children:
            child.close()


def _failures_in_order(children: list[ChildProcess], deadline: float, grace: float,
                       poll: float = 0.05) -> list[ChildProcess]:
    """The children that exited non-zero, in the order their exits were seen (polled every `poll` s)
    until all exited, the deadline passed, or `grace` s after the first failure."""
    pending, failed = list(children), []
    stop = deadline
    while pending and time.monotonic() < stop:
        for child in list(pending):
            if child.process.poll() is not None:
                pending.remove(child)
                if child.process.returncode != 0:
                    if not failed:
                        stop = min(deadline, time.monotonic() + grace)
                    failed.append(child)
        if pending:
            time.sleep(poll)
    return failed


def _describe(argv: list[str]) -> str:
    if "-m" in argv:
        index = argv.index("-m")
        return " ".join(argv[index + 1:index + 3])
    return os.path.basename(argv[0])
