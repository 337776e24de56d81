"""Fabric classes on an emulated cluster: a background flow keeps its guaranteed floor under a saturating
urgent flow, where plain strict priority classes starve it."""

import json

import pytest

from geryon.emulate.cluster import EmulatedCluster
from geryon.emulate.fabric_classes import install_profile
from geryon.emulate.traffic import traffic_argv
from geryon.netconf.tenants import BACKGROUND_DSCP, URGENT_DSCPS, Tenant, Tenants, tenant_profile

pytestmark = pytest.mark.root
RATE = 20_000_000
SECONDS = "3"


def shares(cluster) -> tuple[float, float]:
    """h1 sends urgent and h2 background bulk into h3 at once; each flow's share of the link into h3."""
    sink = cluster.popen("h3", traffic_argv("sink", "--port", "5301"), stdout=-1, text=True)
    try:
        assert json.loads(sink.stdout.readline())["event"] == "listening"
        dst = cluster.host("h3").ip
        senders = [cluster.popen(host, traffic_argv("bulk", dst, "--port", "5301", "--duration", SECONDS,
                                                    "--warmup", "1", "--dscp", str(dscp)), stdout=-1, text=True)
                   for host, dscp in (("h1", URGENT_DSCPS[0]), ("h2", BACKGROUND_DSCP))]
        rates = [json.loads(sender.communicate(timeout=30)[0])["throughput_bps"] for sender in senders]
    finally:
        sink.kill()
        sink.communicate()
    return rates[0] / RATE, rates[1] / RATE


def test_background_keeps_its_floor_under_urgent_traffic(unique_name):
    profile = tenant_profile(Tenants("f", (Tenant("a"), Tenant("b")), background_percent=20))
    classes = ",".join(f"{c.name}:{c.dscps[0]}" for c in profile.classes)
    with EmulatedCluster(unique_name, hosts=3, bw=RATE, classes=classes, ack_priority="off") as cluster:
        urgent, background = shares(cluster)  # strict levels only: background has ~nothing guaranteed
        assert background < 0.05 and urgent > 0.85
        install_profile(cluster, profile)
        urgent, background = shares(cluster)
    assert 0.17 < background < 0.3  # its 20% floor, not more: urgent keeps the rest
    assert urgent > 0.65
