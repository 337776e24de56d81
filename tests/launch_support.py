"""Helpers shared by the launcher's tests: run `python -m geryon.launch`, read rank output, find leftovers."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from geryon import envvars

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_cnn.py"
PYTHON = sys.executable
# Tiny and quick: the loss-curve comparisons only need the first iterations.
# --global-batch-size: one process and W workers train on the same global batch (the same curve).
EXAMPLE_ARGS = ["--iterations", "20", "--width", "4", "--train-size", "512", "--test-size", "100",
                "--global-batch-size", "64", "--log-json"]


def clean_env(**extra) -> dict[str, str]:
    """The test process's environment without any geryon/torch rank variables, plus `extra`; how ranks
    start (GERYON_START, tests/conftest.py) is kept."""
    rank_variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
    env = {k: v for k, v in os.environ.items()
           if (k == envvars.START or not k.startswith("GERYON_")) and k not in rank_variables}
    env.update(extra)
    return env


def launcher_argv(*args) -> list[str]:
    return [PYTHON, "-m", "geryon.launch", *map(str, args)]


def run_launcher(*args, timeout: float = 180, env=None) -> subprocess.CompletedProcess:
    """Run the launcher to its end; stdout and stderr as text. On timeout it is stopped like Ctrl-C."""
    return run_stoppable(launcher_argv(*args), timeout, env, stop_signal=signal.SIGINT)


def run_stoppable(argv, timeout: float, env=None, stop_signal=signal.SIGTERM) -> subprocess.CompletedProcess:
    """Run `argv` in its own session; on timeout signal it, then kill its whole process group, and fail."""
    process = subprocess.Popen(argv, cwd=REPO, env=env or clean_env(), text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(stop_signal)
        try:
            out, err = process.communicate(timeout=30)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        raise AssertionError(f"{argv} ran over {timeout} s; stopped it. stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


# PyTorch 2.13 + gloo + DDP: a rank can abort at interpreter exit, after its work is done, with this message
# (gloo's threads outlive the process group; pytorch/pytorch#190489, docs/ddp-compat.md). Seen once in CI,
# in none of 230 runs here.
EXIT_ABORT = "terminate called without an active exception"


def one_process_result(script, out: Path) -> dict:
    """Run `python script --out OUT` as one process (the reference a distributed run must equal) and
    load the tensors it saved to OUT."""
    import torch

    run = run_stoppable([PYTHON, str(script), "--out", str(out)], 120)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out, weights_only=True)


def run_plain_torchrun(script, args, workers: int, timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run `script` under plain `torch.distributed.run --standalone`, with Python's faulthandler on.

    Returns the run and, when its only failure was PyTorch's exit-time abort (EXIT_ABORT, ranks ending
    on SIGABRT or on torchrun's SIGTERM after it), the reason to report once the caller has checked the
    results; any other failure fails here with the tails of stdout and stderr.
    """
    result = run_stoppable([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            str(workers), str(script), *map(str, args)], timeout,
                           env=clean_env(PYTHONFAULTHANDLER="1"))
    if result.returncode == 0:
        return result, ""
    if only_exit_abort(result.stderr):
        return result, exit_abort_reason("a rank")
    raise AssertionError(f"torchrun exited {result.returncode}\nstdout:\n{result.stdout[-2000:]}\n"
                         f"stderr:\n{result.stderr[-3000:]}")


def launcher_exit_abort(result: subprocess.CompletedProcess) -> bool:
    """Whether geryon.launch failed only because a rank ended on EXIT_ABORT (SIGABRT: exit code 134)."""
    return result.returncode == 128 + signal.SIGABRT and EXIT_ABORT in result.stderr \
        and "was killed by SIGABRT" in result.stderr


def exit_abort_reason(who: str) -> str:
    """What a test reports (xfail) when `who` ended on EXIT_ABORT after its results were checked."""
    return (f"training checked and right, but {who} aborted at exit with {EXIT_ABORT!r} "
            "(PyTorch's gloo teardown, docs/ddp-compat.md)")


def only_exit_abort(torchrun_stderr: str) -> bool:
    """Whether torchrun's report says EXIT_ABORT and no failure but SIGABRT (-6) and its SIGTERMs (-15)."""
    exit_codes = set(re.findall(r"exitcode\s*:\s*(-?\d+)", torchrun_stderr))
    return EXIT_ABORT in torchrun_stderr and "-6" in exit_codes and exit_codes <= {"-6", "-15"}


def start_launcher(*args, env=None) -> subprocess.Popen:
    """Start the launcher in its own session (so a test can signal it alone)."""
    return subprocess.Popen(launcher_argv(*args), cwd=REPO, env=env or clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


class BackgroundLaunch:
    """A launcher run beside the test's own work: started at once, its pipes drained as it goes, its result
    read with `result()`; leaving the `with` block stops it (SIGINT, then its process group killed)."""

    def __init__(self, *args, env=None):
        self.process = start_launcher(*args, env=env)
        self._output: list[str] = []
        self._reader = threading.Thread(target=lambda: self._output.extend(self.process.communicate()),
                                        daemon=True)
        self._reader.start()

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.stop()
            raise AssertionError(f"{self.process.args} ran over {timeout} s; stopped it")
        out, err = self._output
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, out, err)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self._reader.join(30)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._reader.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def marker() -> str:
    """A unique word to put on rank command lines, to find their processes later."""
    return "gymark" + uuid.uuid4().hex[:8]


def live_pids(matches) -> list[int]:
    """PIDs of live processes other than this one (zombies left out) whose /proc folder `matches`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and matches(entry):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _environ(proc: Path) -> list[bytes]:
    return (proc / "environ").read_bytes().split(b"\0")


def _parent(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])


def pids_with(word: str) -> list[int]:
    """PIDs of live processes whose command line contains `word`."""
    return live_pids(lambda proc: word.encode() in (proc / "cmdline").read_bytes())


def pids_of_job(job: str) -> list[int]:
    """PIDs of live processes whose environment has GERYON_JOB_ID=job (workers and servers)."""
    return live_pids(lambda proc: f"GERYON_JOB_ID={job}".encode() in _environ(proc))


def rank_pid(launcher_pid: int, rank_name: str, timeout: float = 60.0) -> int:
    """The PID of the launcher's rank `rank_name` (worker1, server0, ...): its child with that
    GERYON_RANK_NAME (--start exec), or its template's child of that name (--start fork)."""
    needle = f"GERYON_RANK_NAME={rank_name}".encode()

    def is_rank(proc: Path) -> bool:
        parent = _parent(proc)
        if parent == launcher_pid:
            return needle in _environ(proc)
        return (proc / "comm").read_text().strip() == rank_name and \
            _parent(Path(f"/proc/{parent}")) == launcher_pid

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = live_pids(is_rank)
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no process for {rank_name} under launcher {launcher_pid}")


def assert_no_processes(word: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while pids_with(word) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids_with(word), f"leftover processes with {word!r}: {pids_with(word)}"


def rank_lines(stdout: str, rank: str) -> list[str]:
    """The lines a rank printed, without their `[rank] ` prefix."""
    prefix = f"[{rank}] "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


def json_records(lines: list[str]) -> list[dict]:
    records = []
    for line in lines:
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def loss_curve(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records if "iteration" in r]


def job_id(stderr: str) -> str:
    """The job id from the launcher's banner line."""
    for line in stderr.splitlines():
        if line.startswith("geryon.launch: job "):
            return line.split()[2].rstrip(":")
    raise AssertionError(f"no banner in launcher output:\n{stderr}")


def run_single_process(*args, timeout: float = 120) -> list[dict]:
    """The example alone (no launcher): its JSON records."""
    result = run_stoppable([PYTHON, str(EXAMPLE), *args], timeout)
    assert result.returncode == 0, result.stderr
    return json_records(result.stdout.splitlines())


def run_launcher_killing(*args, victim: str, when: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the launcher and SIGKILL rank `victim` (worker1, server0, ...) of the job's first start as soon
    as a line of its output contains `when`; the run to its end, stdout and stderr as text."""
    process = subprocess.Popen(launcher_argv(*args), cwd=REPO, env=clean_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    stopper = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))
    stopper.start()
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    reader.start()
    lines, killed = [], False
    try:
        for line in process.stdout:
            lines.append(line)
            if not killed and when in line:
                os.kill(rank_pid(process.pid, victim), signal.SIGKILL)   # the only one yet: the first start's
                killed = True
        process.wait()
        reader.join()
    finally:
        stopper.cancel()
    assert killed, f"no output line with {when!r}; stderr:\n{''.join(errors)[-3000:]}"
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(lines), "".join(errors))

