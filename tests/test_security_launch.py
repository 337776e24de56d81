"""Issue 13, findings 4-6 at the launcher: secrets, files, input, orphans.

Real launchers are SIGKILLed and their ranks must go; a real sshd must not see the job secret on a
command line; symlinks planted at temporary names must not be followed.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from geryon import envvars
from geryon.errors import ConfigError
from geryon.launch.config import parse_launch_args
from geryon.launch.ssh_run import remote_command
from launch_support import (PYTHON, REPO, clean_env, live_pids, marker, pids_with, start_launcher)

RANK_START = "exec"   # finds ranks by their environment (/proc/PID/environ): tests/conftest.py


# -- finding 5: input ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_non_finite_timeout_is_rejected(value, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError, match="finite"):
        parse_launch_args(["--local", f"--timeout={value}", str(script)], environ={})
    with pytest.raises(ConfigError, match="finite"):
        parse_launch_args(["--local", f"--grace={value}", str(script)], environ={})


def test_transport_timeout_nan_is_rejected():
    from geryon.runtime.env import RankEnv
    from geryon.transport.config import TransportConfig

    with pytest.raises(ConfigError):
        TransportConfig(secret="s", timeout=float("nan"))
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="connect_timeout"):
            TransportConfig(secret="s", connect_timeout=bad)
    with pytest.raises(ConfigError):
        RankEnv.from_environ({"GERYON_TRANSPORT_TIMEOUT": "nan"})


@pytest.mark.parametrize("name", ["a/b", "../etc", "..", ".", "x\n", "", "-n", "a b", "x" * 65])
def test_bad_netns_names_are_rejected(name):
    from geryon.netnames import check_netns_name

    with pytest.raises(ConfigError):
        check_netns_name(name)


def test_netconf_cli_rejects_a_netns_path():
    result = subprocess.run([PYTHON, "-m", "geryon", "netconf", "show", "--dev", "eth0",
                             "--netns=../../tmp/x"], cwd=REPO, capture_output=True, text=True, env=clean_env())
    assert result.returncode != 0
    assert "bad network namespace name" in result.stderr


def test_netns_names_in_use_pass():
    from geryon.netnames import check_netns_name

    for name in ("gyrun-sw", "gyab12c-h1", "ns_1.test"):
        assert check_netns_name(name) == name


def test_names_with_a_trailing_newline_are_rejected():
    from geryon.emulate.topology import check_name
    from geryon.netconf.classes import PriorityClass, validate_classes

    with pytest.raises(ConfigError):
        check_name("demo\n")
    with pytest.raises(ConfigError):
        validate_classes([PriorityClass("high\n", 46)])


# -- finding 4: files and secrets ---------------------------------------------------------------
def test_timeline_does_not_follow_a_planted_symlink(tmp_path):
    from geryon.timeline import RankTimeline, merge_parts, part_path

    victim = tmp_path / "victim"
    victim.write_text("precious")
    timeline = tmp_path / "trace.json"
    part = part_path(str(timeline), "worker0")
    for predictable in (f"{part}.tmp", f"{timeline}.tmp"):
        os.symlink(victim, predictable)
    RankTimeline(str(timeline), "worker0").save()
    merge_parts(str(timeline))
    assert victim.read_text() == "precious"
    assert json.loads(timeline.read_text())["traceEvents"] is not None


def test_cluster_record_does_not_follow_a_planted_symlink(tmp_path, monkeypatch):
    from geryon.emulate import state

    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = state.record_path("sec1")
    path.parent.mkdir(parents=True)
    os.symlink(victim, path.with_suffix(f".json.tmp{os.getpid()}"))
    state.write_record("sec1", {"name": "sec1"})
    assert victim.read_text() == "precious"
    assert state.read_record("sec1") == {"name": "sec1"}
    os.symlink(victim, state.record_path("sec2"))          # a dangling or planted link at the record
    assert not state.claim_record("sec2")
    assert victim.read_text() == "precious"


def test_remote_command_line_carries_no_secret():
    from geryon.launch.ssh_run import SECRET_VARIABLE

    secret = "s3cr3t-" + marker()
    with pytest.raises(Exception):
        remote_command(["python", "x.py"], {SECRET_VARIABLE: secret, "A": "1"}, "/tmp")
    line = remote_command(["python", "x.py"], {"A": "1"}, "/tmp")
    assert secret not in line and "read -r GERYON_JOB_SECRET" in line


# -- finding 6: orphans -------------------------------------------------------------------------
_WAITER = ("import os, sys, time\nprint('pid', os.getpid(), os.environ.get('GERYON_ROLE', 'worker'), "
           "len(os.environ.get('GERYON_JOB_SECRET', '')), flush=True)\ntime.sleep(300)\n")


def _descendants(root: int) -> list[int]:
    """Live descendants of `root` (by /proc parent links)."""
    parents = {}
    for pid in live_pids(lambda proc: True):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}") and
                 open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    return alive


@pytest.mark.timing
def test_sigkilled_local_launcher_leaves_no_ranks_or_servers(tmp_path):
    word = marker()
    script = tmp_path / "wait.py"
    script.write_text(_WAITER)
    launcher = start_launcher("--local", "--mode", "ps", "--workers", "2", "--servers", "1", script, word)
    try:
        for _ in range(2):
            line = launcher.stdout.readline()
            assert line.startswith("[worker"), (line, launcher.stderr.read())
        time.sleep(1.0)                      # the server role is up too
        ranks = _descendants(launcher.pid)
        assert len(ranks) >= 3, ranks        # two workers, one server
        launcher.kill()
        launcher.wait()
        assert _wait_gone(ranks, 5.0) == [], "ranks or servers outlived their SIGKILLed launcher"
    finally:
        launcher.kill()
        launcher.wait()
        for pid in pids_with(word):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timing
@pytest.mark.root
def test_ssh_rank_gets_the_secret_on_stdin_and_dies_with_its_launcher(tmp_path):
    """Findings 4 and 6 over a real sshd: the secret arrives, and a SIGKILLed launcher leaves nothing."""
    from test_launch_ssh import Keys, free_port, sshd_argv, stop, wait_listening

    keys = Keys(tmp_path)
    port = free_port()
    sshd = subprocess.Popen(sshd_argv(keys, "127.0.0.1", port))
    word = marker()
    script = tmp_path / "wait.py"
    script.write_text(_WAITER)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"127.0.0.1:{port} slots=2 key={keys.folder / 'client'} iface=lo\n")
    launcher = None
    try:
        wait_listening(keys, "127.0.0.1", port)
        launcher = start_launcher("--hostfile", hostfile, "--known-hosts", keys.known_hosts([("127.0.0.1", port)]),
                                  "--workers", "2", script, word)
        pids = []
        for _ in range(2):
            line = launcher.stdout.readline()
            assert line.startswith("[worker"), (line, launcher.stderr.read())
            _, pid, _role, secret_length = line.split("] ", 1)[1].split()
            assert secret_length == "32"              # the rank has the job secret ...
            pids.append(int(pid))
        for pid in pids:                              # ... and no command line on the host shows it
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            secret = next(v for v in environ if v.startswith(b"GERYON_JOB_SECRET="))
            for other in live_pids(lambda proc: True):
                try:
                    assert secret not in open(f"/proc/{other}/cmdline", "rb").read()
                except OSError:
                    continue
        launcher.kill()
        launcher.wait()
        assert _wait_gone(pids, 10.0) == [], "remote ranks outlived their SIGKILLed launcher"
    finally:
        if launcher is not None:
            launcher.kill()
            launcher.wait()
        for pid in pids_with(word):
            os.kill(pid, signal.SIGKILL)
        stop(sshd)


@pytest.mark.timing
@pytest.mark.root
def test_sigkilled_emulate_launcher_leaves_no_ranks_and_a_cleanable_cluster(tmp_path):
    word = marker()
    script = tmp_path / "wait.py"
    script.write_text(_WAITER)
    launcher = start_launcher("--emulate", "--workers", "2", "--grace", "1", script, word)
    job = None
    try:
        banner = launcher.stderr.readline()
        job = banner.split()[2].rstrip(":")
        pids = []
        for _ in range(2):
            line = launcher.stdout.readline()
            assert line.startswith("[worker"), (banner, line, launcher.stderr.read())
            pids.append(int(line.split("] ", 1)[1].split()[1]))
        launcher.kill()
        launcher.wait()
        assert _wait_gone(pids, 5.0) == [], "ranks outlived their SIGKILLed launcher"
        result = subprocess.run([PYTHON, "-m", "geryon", "emulate", "clean", "--name", job], cwd=REPO,
                                capture_output=True, text=True, env=clean_env())
        assert result.returncode == 0, result.stderr
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"gy{job}-" not in listing
    finally:
        launcher.kill()
        launcher.wait()
        for pid in pids_with(word):
            os.kill(pid, signal.SIGKILL)
        if job:
            subprocess.run([PYTHON, "-m", "geryon", "emulate", "clean", "--name", job], cwd=REPO,
                           capture_output=True, env=clean_env())
