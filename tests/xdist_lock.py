"""Two tests at once where that is safe: a readers-writer lock shared by pytest-xdist's workers.

The suite runs on two xdist workers (`-n 2` in pyproject.toml). A test marked `concurrent` (its checks
are exact results, never a time, a rate or a share of a port) holds the lock shared, so two such tests
run at once; every other test holds it alone, so nothing runs beside a test that measures a rate, a
share of a port or a deadline. An exclusive test announces itself first (a `want-<worker>` file), and
no shared holder starts while one waits, so it never starves. Without xdist nothing is locked.
"""

import fcntl
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.05
ENV = "PYTEST_GERYON_LOCK_DIR"   # set by the controller, inherited by the workers it starts


def make_lock_dir() -> None:
    """In the controller of an xdist run, before its workers start: make the run's lock directory."""
    os.environ[ENV] = tempfile.mkdtemp(prefix="geryon-tests-")


def lock_dir() -> Path | None:
    """The lock's directory of this xdist run (shared by its workers), None outside xdist."""
    path = os.environ.get(ENV)
    return Path(path) if path and os.environ.get("PYTEST_XDIST_WORKER") else None


@contextmanager
def held(concurrent: bool):
    """Hold the run's lock: shared for a concurrent test, alone for every other one."""
    directory = lock_dir()
    if directory is None:
        yield
        return
    fd = os.open(directory / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        if concurrent:
            while any(directory.glob("want-*")):
                time.sleep(POLL_S)
            fcntl.flock(fd, fcntl.LOCK_SH)
        else:
            want = directory / f"want-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
            want.touch()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                want.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock


def remove_lock_dir() -> None:
    """In the controller, once every worker has finished: remove the run's lock directory."""
    path = os.environ.pop(ENV, None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
