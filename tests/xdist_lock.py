"""Two tests at once where that is safe: a readers-writer lock shared by pytest-xdist's workers.

The suite runs on two xdist workers (`-n 2` in pyproject.toml). A test marked `concurrent` (its checks
are exact results, never a time, a rate or a share of a port) holds the lock shared, so two such tests
run at once; every other test holds it alone, so nothing runs beside a test that measures a rate, a
share of a port or a deadline. An exclusive test announces itself first (a `want-<worker>` file), and
no shared holder starts while one waits, so it never starves. A worker whose next test also runs alone
keeps the lock for it: the other worker would otherwise start a test in between, which the next one must
wait for. Without xdist nothing is locked.
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


_kept_fd: int | None = None   # the exclusive lock, kept from one test that runs alone to the next


@contextmanager
def held(concurrent: bool, keep: bool = False):
    """Hold the run's lock: shared for a concurrent test, alone for every other one. `keep` (a test that
    runs alone, followed on this worker by another one): the lock stays held for that next test."""
    global _kept_fd
    directory = lock_dir()
    if directory is None:
        yield
        return
    if concurrent:
        if _kept_fd is not None:   # kept for a test that did not come: this one would wait on it
            os.close(_kept_fd)
            _kept_fd = None
        fd = os.open(directory / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            while any(directory.glob("want-*")):
                time.sleep(POLL_S)
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)   # closing the descriptor releases the lock
        return
    fd, _kept_fd = _kept_fd, None
    if fd is None:
        fd = os.open(directory / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        want = directory / f"want-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
        want.touch()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        finally:
            want.unlink(missing_ok=True)
    try:
        yield
    finally:
        if keep:
            _kept_fd = fd
        else:
            os.close(fd)


def remove_lock_dir() -> None:
    """In the controller, once every worker has finished: remove the run's lock directory."""
    path = os.environ.pop(ENV, None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
