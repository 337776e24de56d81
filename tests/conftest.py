"""Shared fixtures: root detection, unique names for resources a test creates, a veth pair between two
namespaces."""

import os
import signal
import subprocess
import uuid

import pytest

import xdist_lock
from geryon import envvars

# The Ctrl-C tests send SIGINT to launchers they start. A test run started in the background by a
# non-interactive shell (`cmd &`) ignores SIGINT, and children inherit SIG_IGN across exec, so those
# launchers would never see Ctrl-C: give this process a handler (reset to the default on exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The jobs tests launch start their ranks from a template that imported torch once (`--start fork`,
# geryon.launch.template): a test job's ranks run for a second or two, and an interpreter importing
# torch for each would be most of the suite's CPU. A module that finds a rank's process by its
# environment (/proc/PID/environ, which a forked rank does not rewrite) sets RANK_START = "exec", and
# so the default start stays tested too. GERYON_START set before pytest starts wins over both.
RANK_START = os.environ.get(envvars.START)


@pytest.fixture(autouse=True, scope="module")
def rank_start(request):
    """GERYON_START for every job this module's tests launch (clean_env keeps it)."""
    start = RANK_START or getattr(request.module, "RANK_START", "fork")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(envvars.START, start)
        yield start


# Modules whose tests may run beside another one (tests/xdist_lock.py): every check in them is an exact
# result (parameters against one process, a rendering, a parse), never a time, a rate, a share of a
# port or a deadline tighter than a loaded machine keeps; a test in them that checks one of those is marked
# `timing` and runs alone. Every other module runs alone.
CONCURRENT_MODULES = frozenset("""
    test_allreduce test_allreduce_overlap test_allreduce_prepared test_analyze test_api test_api_transport
    test_bench_diff test_bench_loopback test_bench_paper test_bench_paper_allreduce test_bench_paper_math
    test_bench_periods test_bench_tenants test_bench_wire_ring test_benches test_categorize_classes
    test_categorize_cli test_categorize_model test_categorize_urgency test_childproc test_class_groups
    test_class_groups_cuda test_cluster_emulated test_cluster_qos test_cuda_training test_ddp_compat test_demo
    test_device test_docs_links test_emulate_cli test_emulate_cluster test_emulate_mtu test_emulate_topology
    test_engines_emulated test_engines_env test_engines_files test_example test_faults_emulated test_fuzz_volume
    test_gloo_buffers test_gpu_check test_hostfile test_launch_config test_launch_emulate test_launch_local
    test_launch_recover test_launch_search test_launch_ssh test_launch_supervise test_launch_transport test_lint
    test_netconf_ackprio test_netconf_apply test_netconf_classes test_netconf_cli test_netconf_plan
    test_netnames test_partial_sync test_profile_parse test_ps test_ps_optimizers_launch test_ps_reads
    test_qos_ackprio test_qos_counters test_qos_profile test_qos_render test_qos_safety test_qos_safety_sonic
    test_qos_tcstate test_qos_tenants test_qos_vendor_session test_quickexit test_reduce_gloo
    test_report_threshold test_ring_preemption test_safefiles test_search_methods test_security_launch
    test_security_rendezvous test_security_tls test_server_optimizer test_sim test_sim_jobs test_sim_ring
    test_soak_emulated test_staging test_threshold_emulated test_threshold_search test_threshold_sigterm
    test_launch_template test_timeline test_train_resnet test_transport_ddp test_transport_emulated
    test_transport_fastpath test_transport_flows test_transport_hooks test_transport_trace test_wheel test_wire
""".split())


# The concurrent modules that take longest (seconds of their concurrent tests' time in a full run on 2
# cores, docs/results/test-suite_x86-2core_2026-12-04.md; an order, not a promise): xdist deals modules
# to workers in the order of the items (--dist loadfile).
LONGEST_MODULES = {
    "test_ps_optimizers_launch": 95, "test_faults_emulated": 89, "test_benches": 67, "test_ddp_compat": 48,
    "test_security_tls": 43, "test_engines_emulated": 37, "test_launch_ssh": 36, "test_train_resnet": 31,
    "test_launch_transport": 26, "test_bench_paper": 26, "test_launch_search": 23, "test_soak_emulated": 21,
    "test_launch_recover": 17, "test_launch_template": 15, "test_fuzz_volume": 15, "test_allreduce_overlap": 15,
}


def pytest_collection_modifyitems(config, items):
    concurrent = pytest.mark.concurrent
    for item in items:
        if item.module.__name__ in CONCURRENT_MODULES and item.get_closest_marker("timing") is None:
            item.add_marker(concurrent)
    # concurrent modules first, so that both workers start on tests that may share the machine; among
    # them the longest first, so that neither worker is left with a long module when the other is done
    items.sort(key=lambda item: (item.get_closest_marker("concurrent") is None,
                                 -LONGEST_MODULES.get(item.module.__name__, 0)))
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


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of a test under the run's lock (tests/xdist_lock.py): shared when its
    module is marked `concurrent`, alone otherwise (and kept for the next test if it too runs alone);
    outside pytest-timeout's timer, which starts inside."""
    alone_next = nextitem is not None and nextitem.get_closest_marker("concurrent") is None
    with xdist_lock.held(item.get_closest_marker("concurrent") is not None, keep=alone_next):
        yield


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        xdist_lock.make_lock_dir()   # the controller of an xdist run, before it starts its workers


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        xdist_lock.remove_lock_dir()


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
    """A short unique run name (≤ 6 chars) so parallel tests never share namespaces; a cluster of that
    name that a failing test left behind is removed after it."""
    name = "t" + uuid.uuid4().hex[:5]
    yield name
    if os.geteuid() == 0:
        from geryon.emulate import clean, fabric
        if fabric.list_netns(f"gy{name}-"):
            clean(name=name)


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
