"""`geryon emulate up|exec|down|list|clean` end to end, and clear errors (exit code 1) for bad input."""

import json
import subprocess
import sys

import pytest

from geryon.cli import main
from geryon.emulate import clean, fabric, state


def geryon(*argv, timeout=60):
    return subprocess.run([sys.executable, "-m", "geryon", *argv], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.root
def test_up_exec_list_down(unique_name):
    try:
        up = geryon("emulate", "up", "--name", unique_name, "--hosts", "3", "--bw", "20mbit",
                    "--classes", "high:46,low:0")
        assert up.returncode == 0, up.stderr
        described = json.loads(up.stdout)
        assert described["rate"] == 20_000_000 and described["priority"] is True
        assert [c["dscp"] for c in described["classes"]] == [46, 0]
        h2 = described["hosts"][1]
        assert h2 == {"name": "h2", "netns": f"gy{unique_name}-h2", "ip": "10.199.0.2", "iface": "eth0",
                      "switch": "sw", "switch_port": {"netns": f"gy{unique_name}-sw", "dev": "h2"}}
        # the cluster outlives the command that built it
        assert len(fabric.list_netns(f"gy{unique_name}-")) == 4

        run = geryon("emulate", "exec", unique_name, "h2", "--", "ip", "-o", "-4", "addr", "show", "eth0")
        assert run.returncode == 0 and "10.199.0.2/16" in run.stdout
        failing = geryon("emulate", "exec", unique_name, "h1", "--", "sh", "-c", "exit 7")
        assert failing.returncode == 7

        listed = json.loads(geryon("emulate", "list", "--json").stdout)
        mine = [c for c in listed if c["name"] == unique_name]
        assert mine and mine[0]["state"] == "up" and mine[0]["namespaces"] == 4

        again = geryon("emulate", "up", "--name", unique_name, "--hosts", "2")
        assert again.returncode == 1 and "already exists" in again.stderr

        down = geryon("emulate", "down", unique_name)
        assert down.returncode == 0, down.stderr
        assert not fabric.list_netns(f"gy{unique_name}-") and not state.record_exists(unique_name)
        gone = geryon("emulate", "down", unique_name)
        assert gone.returncode == 1 and "no emulated cluster" in gone.stderr
        missing = geryon("emulate", "exec", unique_name, "h1", "--", "true")
        assert missing.returncode == 1 and "no emulated cluster" in missing.stderr
    finally:
        clean(name=unique_name)


@pytest.mark.root
def test_up_leafspine_without_priority(unique_name, capsys):
    try:
        assert main(["emulate", "up", "--name", unique_name, "--hosts", "4", "--topology", "leafspine",
                     "--no-priority"]) == 0
        described = json.loads(capsys.readouterr().out)
        assert described["topology"] == "leafspine" and described["queues"] == "shaping"
        assert [s["netns"] for s in described["switches"]] == [f"gy{unique_name}-{n}" for n in ("l1", "l2", "sp")]
        assert main(["emulate", "exec", unique_name, "h9", "--", "true"]) == 1
        assert "no host 'h9'" in capsys.readouterr().err
        assert main(["emulate", "clean", "--name", unique_name]) == 0
        assert len(json.loads(capsys.readouterr().out)["namespaces"]) == 7
    finally:
        clean(name=unique_name)


@pytest.mark.parametrize("argv, message", [
    (["--name", "ok1", "--bw", "100furlongs"], "unknown rate"),
    (["--name", "Bad_Name"], "bad cluster name"),
    (["--name", "toolong7"], "bad cluster name"),
    (["--name", "ok1", "--hosts", "1"], "host count"),
    (["--name", "ok1", "--hosts", "65"], "host count"),
    (["--name", "ok1", "--classes", "high:99,low:0"], "DSCP"),
])
def test_bad_input_is_a_clear_error(argv, message, capsys):
    # validation happens before anything is built, so these never touch the kernel
    assert main(["emulate", "up", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("geryon: error:") and message in err


def test_exec_needs_a_command(capsys):
    assert main(["emulate", "exec", "demo", "h1"]) == 1
    assert "no command" in capsys.readouterr().err


def test_up_without_root_says_so(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["emulate", "up", "--name", "ok1"]) == 1
    assert "needs root" in capsys.readouterr().err
