"""A SIGTERM to `geryon bench threshold --backend emulated` cleans up like Ctrl-C (root).

The bench runs in a subprocess with its own cluster name; once its role processes are up it gets a
SIGTERM, and afterwards no namespace of that cluster and no role process may remain.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geryon.signals import sigterm_as_interrupt
from geryon.emulate import clean
from geryon.emulate.fabric import list_netns

ROLE_MODULE = "geryon.bench.replay_roles"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(root: int) -> dict[int, str]:
    """{pid: command line} of every living descendant of `root`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                found[child] = (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                                .decode(errors="replace"))
            except OSError:
                continue
            todo.append(child)
    return found


def test_sigterm_handler_restored_and_raises_interrupt():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                 # the handler runs at the next bytecode boundary
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.root
@pytest.mark.slow
def test_sigterm_removes_namespaces_and_role_processes(unique_name, tmp_path):
    argv = [sys.executable, "-m", "geryon", "bench", "threshold", "--backend", "emulated",
            "--model", "vgg19", "--workers", "2", "--servers", "1", "--cluster-name", unique_name,
            "--out", str(tmp_path / "RUN.json")]
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    roles: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and bench.poll() is None:
            roles = {pid: cmd for pid, cmd in _descendants(bench.pid).items() if ROLE_MODULE in cmd}
            if len(roles) == 3 and list_netns(f"gy{unique_name}"):
                break
            time.sleep(0.2)
        assert len(roles) == 3, f"role processes did not start: {bench.poll()} {roles}"
        time.sleep(1.0)                   # mid-start: roles importing torch, or already stepping
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=90)
        assert bench.returncode == 130, stderr[-2000:]
        assert list_netns(f"gy{unique_name}") == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in roles):
            time.sleep(0.1)
        assert [pid for pid in roles if _alive(pid)] == []
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in roles:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        clean(name=unique_name)
