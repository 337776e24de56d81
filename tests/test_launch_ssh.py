"""The SSH backend against real sshd processes, with throwaway keys; host keys are really checked.

sshd runs on 127.0.0.1 (unique ports) and inside emulated-cluster hosts, where the launcher itself
runs in another host of the cluster, as it would on a real cluster's head node.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from launch_support import (EXAMPLE, EXAMPLE_ARGS, REPO, clean_env, json_records, launcher_argv,
                            loss_curve, rank_lines, run_launcher, run_single_process)
from ports import free_port

pytestmark = pytest.mark.root  # sshd wants root to switch to the logged-in user
SSHD = "/usr/sbin/sshd"


class Keys:
    """A throwaway client key pair and host key, and an authorized_keys with the client key."""

    def __init__(self, folder: Path):
        self.folder = folder
        for name in ("host", "client", "impostor"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
                           check=True)
        (folder / "authorized_keys").write_text((folder / "client.pub").read_text())

    def public(self, name: str) -> str:
        return " ".join((self.folder / f"{name}.pub").read_text().split()[:2])

    def known_hosts(self, entries: list[tuple[str, int]], key: str = "host") -> Path:
        path = self.folder / f"known_hosts_{key}"
        path.write_text("".join(f"[{ip}]:{port} {self.public(key)}\n" for ip, port in entries))
        return path


def sshd_argv(keys: Keys, address: str, port: int) -> list[str]:
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    tag = f"{address}_{port}"
    config = keys.folder / f"sshd_{tag}.conf"
    config.write_text(f"Port {port}\nListenAddress {address}\nHostKey {keys.folder / 'host'}\n"
                      f"AuthorizedKeysFile {keys.folder / 'authorized_keys'}\nPubkeyAuthentication yes\n"
                      f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                      f"StrictModes no\nPidFile {keys.folder / f'sshd_{tag}.pid'}\n")
    return [SSHD, "-D", "-e", "-f", str(config), "-E", str(keys.folder / f"sshd_{tag}.log")]


def wait_listening(keys: Keys, address: str, port: int, timeout: float = 10.0) -> None:
    log = keys.folder / f"sshd_{address}_{port}.log"
    deadline = time.monotonic() + timeout
    while not (log.exists() and "Server listening" in log.read_text()):
        assert time.monotonic() < deadline, f"sshd on {address}:{port} did not start"
        time.sleep(0.05)




def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def loopback_sshd(tmp_path):
    """One sshd on 127.0.0.1:<free port>; yields (keys, port)."""
    keys = Keys(tmp_path)
    port = free_port()
    process = subprocess.Popen(sshd_argv(keys, "127.0.0.1", port))
    try:
        wait_listening(keys, "127.0.0.1", port)
        yield keys, port
    finally:
        stop(process)


@pytest.mark.slow
def test_job_over_ssh_matches_single_process(loopback_sshd):
    keys, port = loopback_sshd
    hostfile = keys.folder / "hostfile"
    hostfile.write_text(f"127.0.0.1:{port} slots=2 key={keys.folder / 'client'} iface=lo\n")
    known = keys.known_hosts([("127.0.0.1", port)])
    result = run_launcher("--hostfile", hostfile, "--known-hosts", known, "--mode", "ps", EXAMPLE,
                          *EXAMPLE_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 host over SSH" in result.stderr
    records = json_records(rank_lines(result.stdout, "worker0"))
    assert loss_curve(records) == pytest.approx(loss_curve(run_single_process(*EXAMPLE_ARGS)),
                                                rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_failing_remote_rank_stops_the_others(loopback_sshd, tmp_path):
    keys, port = loopback_sshd
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    time.sleep(0.5)\n"
                      "    sys.exit('remote worker 1 fails')\nprint('pid', os.getpid(), flush=True)\n"
                      "time.sleep(300)\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"127.0.0.1:{port} slots=3 key={keys.folder / 'client'}\n")
    result = run_launcher("--hostfile", hostfile, "--known-hosts", keys.known_hosts([("127.0.0.1", port)]),
                          "--workers", "3", script)
    assert result.returncode == 1
    assert "worker1 failed with exit code 1" in result.stderr and "remote worker 1 fails" in result.stderr
    pids = [int(line.split()[1]) for rank in ("worker0", "worker2") for line in rank_lines(result.stdout, rank)]
    assert len(pids) == 2
    time.sleep(0.5)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "remote ranks left running"


def test_wrong_or_unknown_host_key_is_refused(loopback_sshd, tmp_path):
    keys, port = loopback_sshd
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"127.0.0.1:{port} key={keys.folder / 'client'}\n")
    wrong = keys.known_hosts([("127.0.0.1", port)], key="impostor")
    result = run_launcher("--hostfile", hostfile, "--known-hosts", wrong, EXAMPLE, timeout=60)
    assert result.returncode == 1
    assert "does not match" in result.stderr and "refusing to connect" in result.stderr
    assert "[worker" not in result.stdout
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    result = run_launcher("--hostfile", hostfile, "--known-hosts", empty, EXAMPLE, timeout=60)
    assert result.returncode == 1
    assert f"[127.0.0.1]:{port} is not in" in result.stderr and "never accepts unknown host keys" in result.stderr


@pytest.mark.slow
def test_job_over_ssh_into_emulated_hosts(tmp_path, unique_name):
    """sshd in hosts h2 and h3 of an emulated cluster; the launcher runs in h1 (the 'head node')."""
    from geryon.emulate import EmulatedCluster

    keys = Keys(tmp_path)
    with EmulatedCluster(unique_name, hosts=3, bw="1gbit") as cluster:
        head, *nodes = cluster.hosts
        daemons = [cluster.popen(node, sshd_argv(keys, node.ip, 2222)) for node in nodes]
        try:
            for node in nodes:
                wait_listening(keys, node.ip, 2222)
            hostfile = tmp_path / "hostfile"
            hostfile.write_text("".join(f"{node.ip}:2222 key={keys.folder / 'client'} iface={node.iface}\n"
                                        for node in nodes))
            known = keys.known_hosts([(node.ip, 2222) for node in nodes])
            launcher = cluster.popen(head, launcher_argv("--hostfile", hostfile, "--known-hosts", known,
                                                         "--mode", "ps", "--workers", "2", EXAMPLE,
                                                         *EXAMPLE_ARGS),
                                     cwd=REPO, env=clean_env(), text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
            try:
                out, err = launcher.communicate(timeout=120)
            finally:
                launcher.kill()
                launcher.wait()
            assert launcher.returncode == 0, err[-3000:]
            assert "2 hosts over SSH" in err
            records = json_records(rank_lines(out, "worker0"))
            assert loss_curve(records) == pytest.approx(loss_curve(run_single_process(*EXAMPLE_ARGS)),
                                                        rel=1e-4, abs=1e-5)
        finally:
            for daemon in daemons:
                stop(daemon)
