"""Every emulated link runs at the rate asked for: TCP host -> host within 10% of RATE (iperf3)."""

import json
import subprocess
import time

import pytest

from geryon.emulate import EmulatedCluster

pytestmark = [pytest.mark.root, pytest.mark.slow]

TOLERANCE = 0.10
ATTEMPTS = 3  # other test runs share the cores; the best of a few measures the shaper, not the load


def measured_rate(cluster, src, dst, seconds=3, port=5201):
    """Receiver-side TCP goodput in bits/s of one iperf3 run from src to dst (AssertionError if none)."""
    server = cluster.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            client = cluster.run(src, ["iperf3", "-c", cluster.host(dst).ip, "-p", str(port),
                                       "-t", str(seconds), "-J"], capture_output=True, text=True,
                                 timeout=seconds + 20)
            try:
                report = json.loads(client.stdout)
            except ValueError:
                report = {}
            received = report.get("end", {}).get("sum_received", {}).get("bits_per_second")
            if client.returncode == 0 and received:
                return received
            if "connect" not in report.get("error", ""):
                raise AssertionError(f"iperf3 failed (rc {client.returncode}): {client.stdout[-800:]} "
                                     f"{client.stderr[-300:]}")
            time.sleep(0.1)  # the server is not listening yet
        raise AssertionError("iperf3 server never came up")
    finally:
        server.kill()
        server.wait()


def best_rate(cluster, src, dst, target):
    """The measurement closest to `target` out of a few (stops early once one is within tolerance)."""
    rates, errors = [], []
    for _ in range(ATTEMPTS):
        try:
            rates.append(measured_rate(cluster, src, dst))
        except AssertionError as exc:  # a disturbed run is one more reason to try again
            errors.append(str(exc))
            continue
        if abs(rates[-1] - target) <= TOLERANCE * target:
            break
    assert rates, f"no iperf3 run succeeded: {errors}"
    return min(rates, key=lambda r: abs(r - target)), rates


@pytest.mark.parametrize("priority", [True, False], ids=["priority", "shaping-only"])
def test_tcp_rate_matches_the_link_rate(unique_name, priority):
    rate = 100_000_000
    with EmulatedCluster(unique_name, hosts=3, bw="100mbit", priority=priority) as cluster:
        best, rates = best_rate(cluster, "h1", "h3", rate)
    assert abs(best - rate) <= TOLERANCE * rate, f"measured {[round(r / 1e6, 1) for r in rates]} Mbit/s"


def test_leafspine_uplink_is_the_bottleneck_across_leaves(unique_name):
    # 2 hosts: one per leaf; the uplinks run at half the host rate
    with EmulatedCluster(unique_name, hosts=2, bw="100mbit", topology="leafspine") as cluster:
        uplink = cluster.describe()["uplink_rate"]
        assert uplink == 50_000_000
        best, rates = best_rate(cluster, "h1", "h2", uplink)
    assert abs(best - uplink) <= TOLERANCE * uplink, f"measured {[round(r / 1e6, 1) for r in rates]} Mbit/s"
