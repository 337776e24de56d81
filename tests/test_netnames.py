"""The one home of the namespace directory, the state directory, the nsenter argv and the root check."""

import os
import subprocess

import pytest

from geryon import envvars
from geryon.childproc import in_netns
from geryon.emulate import state as emulate_state
from geryon.errors import ConfigError, PermissionNeeded, require_root
from geryon.netconf import state as netconf_state
from geryon.netnames import DEFAULT_STATE_BASE, NETNS_DIR, netns_path, state_base


def test_a_namespace_path_is_checked_and_under_the_ip_netns_directory():
    assert netns_path("gyab-h1") == f"{NETNS_DIR}/gyab-h1"
    with pytest.raises(ConfigError):
        netns_path("../../proc/1/ns/net")


def test_nsenter_argv_enters_the_named_namespace_and_runs_the_command_as_strings():
    assert in_netns("gyab-h1", ["sleep", 1]) == ["nsenter", f"--net={NETNS_DIR}/gyab-h1", "--", "sleep", "1"]
    assert in_netns(None, ["sleep", 1]) == ["sleep", "1"]
    with pytest.raises(ConfigError):
        in_netns("a/b", ["true"])


def test_every_state_directory_follows_the_one_base(monkeypatch, tmp_path):
    monkeypatch.delenv(envvars.STATE_DIR, raising=False)
    assert str(state_base()) == DEFAULT_STATE_BASE
    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path))
    assert emulate_state.state_dir() == tmp_path / "clusters"
    assert netconf_state.state_dir() == tmp_path / "netconf"


def test_the_root_check_raises_the_typed_error_with_the_next_step(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionNeeded, match=r"^tc \(x\) needs root; run with sudo or use --local$"):
        require_root("tc (x)", "run with sudo or use --local")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert require_root("tc (x)") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a network namespace)")
def test_the_nsenter_argv_really_runs_in_the_namespace():
    name = f"gynn{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        links = subprocess.run(in_netns(name, ["ip", "-o", "link"]), capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert len(links) == 1 and ": lo:" in links[0]   # a fresh namespace holds only its loopback
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
