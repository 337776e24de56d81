"""`clean` removes what a killed process left behind: namespaces, the processes in them, records."""

import json
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

from geryon.emulate import clean, fabric, state
from geryon.emulate.clean import cluster_of

BUILD_AND_HANG = textwrap.dedent("""
    import json, subprocess, sys, time
    from geryon.emulate import EmulatedCluster, fabric
    cluster = EmulatedCluster(sys.argv[1], hosts=3).up()
    sleeper = cluster.popen("h2", ["sleep", "300"])
    # nsenter joins the namespace a moment after Popen returns (a loaded CI machine once lost that race)
    netns, deadline = cluster.host("h2").netns, time.monotonic() + 10
    while sleeper.pid not in fabric.netns_pids([netns]).get(netns, []):
        assert time.monotonic() < deadline, "the sleeper never entered h2's namespace"
        time.sleep(0.01)
    print(json.dumps({"sleeper": sleeper.pid}), flush=True)
    time.sleep(300)
""")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.root
def test_clean_after_sigkill(unique_name):
    builder = subprocess.Popen([sys.executable, "-c", BUILD_AND_HANG, unique_name],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = builder.stdout.readline()
        assert line, "the builder died before the cluster was up"
        sleeper = json.loads(line)["sleeper"]
        builder.send_signal(signal.SIGKILL)
        builder.wait(timeout=10)
        # the kill left everything behind
        assert len(fabric.list_netns(f"gy{unique_name}-")) == 4
        assert state.record_exists(unique_name) and _alive(sleeper)

        report = clean(name=unique_name)
        assert sorted(report.namespaces) == sorted(f"gy{unique_name}-{n}" for n in ("h1", "h2", "h3", "sw"))
        assert sleeper in report.processes
        assert report.records == [unique_name]
    finally:
        if builder.poll() is None:
            builder.kill()
        clean(name=unique_name)
    assert not fabric.list_netns(f"gy{unique_name}-")
    assert not state.record_exists(unique_name)
    assert not _alive(sleeper)


@pytest.mark.root
def test_clean_leaves_other_clusters_alone():
    from pyroute2 import netns
    prefix = "q" + uuid.uuid4().hex[:4]  # 'q' keeps the prefix clear of other runs' 't' names
    mine, other = prefix + "a", prefix + "b"
    netns.create(f"gy{other}-h1")
    netns.create(f"gy{mine}-h1")
    try:
        clean(name=mine)
        assert fabric.list_netns(f"gy{mine}-") == []
        assert fabric.list_netns(f"gy{other}-") == [f"gy{other}-h1"]
        clean(prefix=prefix)  # a prefix-scoped clean reaches both
        assert fabric.list_netns(f"gy{other}-") == []
    finally:
        clean(name=other)
        clean(name=mine)


@pytest.mark.root
def test_clean_removes_a_stale_record(unique_name):
    state.write_record(unique_name, {"name": unique_name, "state": "up", "hosts": []})
    assert clean(name=unique_name).records == [unique_name]
    assert not state.record_exists(unique_name)


def test_cluster_of_names():
    assert cluster_of("gydemo-h1") == "demo"
    assert cluster_of("gydemo-sw") == "demo"
    assert cluster_of("gydemo") is None
    assert cluster_of("eth0") is None
