"""Shared fixtures: root detection, unique names for resources a test creates, a veth pair between two
namespaces."""

import os
import signal
import subprocess
import uuid

import pytest

from geryon import envvars

# The Ctrl-C tests send SIGINT to launchers they start. A test run started in the background by a
# non-interactive shell (`cmd &`) ignores SIGINT, and children inherit SIG_IGN across exec, so those
# launchers would never see Ctrl-C: give this process a handler (reset to the default on exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    if any("cuda" in item.keywords for item in items) and not _cuda_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is false here "
                                         "(scripts/gpu-check.sh runs these on a GPU machine)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(no_gpu)
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces and tc)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that passed after a launch ended on PyTorch's exit-time abort (its `exit_aborts`, set by
    tests/test_ps_optimizers_launch.py: the launches that did) is reported as an xfail naming them."""
    from launch_support import exit_abort_reason

    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and report.passed and getattr(item, "exit_aborts", None):
        report.outcome, report.wasxfail = "skipped", exit_abort_reason(f"a rank of {'; '.join(item.exit_aborts)}")


@pytest.fixture
def unique_name():
    """A short unique run name (≤ 6 chars) so parallel tests never share namespaces."""
    return "t" + uuid.uuid4().hex[:5]


@pytest.fixture
def veth_pair(unique_name, tmp_path, monkeypatch):
    """Two namespaces joined by a veth pair; always deleted, with their netconf state."""
    monkeypatch.setenv(envvars.STATE_DIR, str(tmp_path / "state"))
    from geryon.netconf import forget_netns_state
    from netconf_pair import VethPair, sh

    pair = VethPair(f"gy{unique_name}a", f"gy{unique_name}b")
    created = []
    try:
        for netns in (pair.left_ns, pair.right_ns):
            sh("ip", "netns", "add", netns)
            created.append(netns)
        sh("ip", "-n", pair.left_ns, "link", "add", pair.left_dev, "type", "veth", "peer", "name",
            pair.right_dev, "netns", pair.right_ns)
        for netns, dev, ip, ip6 in ((pair.left_ns, pair.left_dev, pair.left_ip, pair.left_ip6),
                                    (pair.right_ns, pair.right_dev, pair.right_ip, pair.right_ip6)):
            sh("ip", "-n", netns, "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "-n", netns, "addr", "add", f"{ip6}/64", "dev", dev, "nodad")
            sh("ip", "-n", netns, "link", "set", dev, "up")
        yield pair
    finally:
        for netns in created:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
            forget_netns_state(netns)


@pytest.fixture(scope="session")
def single_curve():
    """The example's loss curve trained alone (no launcher): what every distributed run must match."""
    from launch_support import EXAMPLE_ARGS, loss_curve, run_single_process

    curve = loss_curve(run_single_process(*EXAMPLE_ARGS))
    assert len(curve) == 20
    return curve
