"""Vendor sessions executed over SSH against a stand-in switch.

No EOS, Junos, NX-OS, SONiC or Cumulus device is available here, so the endpoint is a real sshd on
127.0.0.1 whose ForceCommand is a shell script that records every command with its stdin and plays a
switch whose running configuration is what it was sent. What is real: SSH with host-key checking, the
session steps in order, the read-back comparison, the roll back on a failed read-back, idempotency.
"""

import json
import os
import socket
import subprocess
import time

import pytest

from geryon.cli import main

pytestmark = pytest.mark.root
RECORDER = """#!/bin/sh
dir=$(dirname "$0")
cmd="$SSH_ORIGINAL_COMMAND"
input=$(cat)
printf '$ %s\\n%s\\n' "$cmd" "$input" >> "$dir/commands.log"
case "$cmd" in
  "show running-config"*) [ -e "$dir/broken" ] || cat "$dir/running" 2>/dev/null ;;
  Cli*) printf '%s\\n' "$input" >> "$dir/running" ;;
esac
exit 0
"""


@pytest.fixture
def fake_switch(tmp_path):
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client.pub").read_text())
    recorder = tmp_path / "switch.sh"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    config = tmp_path / "sshd.conf"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host'}\n"
                      f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPubkeyAuthentication yes\n"
                      "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                      f"PidFile {tmp_path / 'sshd.pid'}\nForceCommand {recorder}\n")
    log = tmp_path / "sshd.log"
    daemon = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config), "-E", str(log)])
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and "Server listening" in log.read_text()):
            assert time.monotonic() < deadline, "sshd did not start"
            time.sleep(0.05)
        key = " ".join((tmp_path / "host.pub").read_text().split()[:2])
        (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {key}\n")
        yield tmp_path, port
    finally:
        daemon.terminate()
        daemon.wait(5)


def apply(folder, port, capsys, *extra):
    code = main(["netconf", "apply", "--profile", "two-class", "--target", f"eos@root@127.0.0.1:{port}",
                 "--ports", "Ethernet1", "--known-hosts", str(folder / "known_hosts"), "--key",
                 str(folder / "client"), "--json", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eos_session_applies_reads_back_confirms_and_is_idempotent(fake_switch, capsys):
    folder, port = fake_switch
    code, out, err = apply(folder, port, capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["changed"] and result["steps"][-2:] == ["read back: matches", "confirm"]
    log = (folder / "commands.log").read_text()
    order = [log.index(s) for s in ("$ show running-config", "configure session geryon-qos\nqos map dscp 46",
                                    "commit timer 00:05:00", "configure session geryon-qos commit")]
    assert order == sorted(order)
    code, out, _ = apply(folder, port, capsys)
    assert code == 0 and not json.loads(out)["changed"] and "no change" in json.loads(out)["steps"][0]


def test_failed_read_back_rolls_the_session_back(fake_switch, capsys):
    folder, port = fake_switch
    (folder / "broken").write_text("")
    code, out, err = apply(folder, port, capsys)
    assert code == 1 and "read back" in err and "configure session geryon-qos abort" in err
    assert "configure session geryon-qos abort" in (folder / "commands.log").read_text()
    assert "configure session geryon-qos commit" not in (folder / "commands.log").read_text()


def test_dry_run_sends_nothing(fake_switch, capsys):
    folder, port = fake_switch
    code, out, _ = apply(folder, port, capsys, "--dry-run")
    assert code == 0 and "commit timer 00:05:00" in "\n".join(json.loads(out)["diff"])
    assert not (folder / "commands.log").exists()
