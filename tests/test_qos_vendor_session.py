"""Vendor sessions executed over SSH against a stand-in switch.

No EOS, Junos, NX-OS, SONiC or Cumulus device is available here, so the endpoint is a real sshd on
127.0.0.1 whose ForceCommand is a shell script that records every command with its stdin and plays a
switch whose running configuration is what it was sent. What is real: SSH with host-key checking, the
session steps in order, the read-back comparison, the roll back on a failed read-back, idempotency.
"""

import json

import pytest

from geryon.cli import main
from sshd_support import forced_command_sshd

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
    with forced_command_sshd(tmp_path, RECORDER) as port:
        yield tmp_path, port


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
