"""Each `geryon bench` end to end, small: it runs, prints one JSON object per result line, and the
fairness fields hold (same congestion control everywhere, the baseline's DSCP, bulk traffic seen)."""

import json
import re
import signal
import subprocess
import sys

import pytest

from geryon.bench.diff import diff_rows
from geryon.emulate import fabric, state
from launch_support import REPO, clean_env

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _bench(*argv: str, timeout: float = 300) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "geryon", "bench", *argv, "--json"], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_bench_transport_baseline_shares_the_dscp_and_congestion_control():
    records = _bench("transport", "--bw", "100mbit", "--size-mb", "1", "--iters", "1", "--policies",
                     "geryon,vanilla", "--congestion", "cubic", "--iperf-seconds", "1")
    baselines = [r for r in records if r["system"] == "iperf3"]
    assert sorted(r["dscp"] for r in baselines) == [0, 46]   # geryon's class 0 flow, vanilla's one flow
    systems = [r for r in records if r["system"] in ("ps", "allreduce")]
    assert len(systems) == 4 and all(r["congestion"] == "cubic" and r["ratio_vs_iperf3"] > 0 for r in systems)
    assert {r["policy"]: r["baseline_dscp"] for r in systems} == {"geryon": 46, "vanilla": 0}


def test_bench_allreduce_names_the_congestion_control_gloo_used_too():
    records = _bench("allreduce", "--workers", "2", "--sizes", "1e5", "--iters", "1", "--congestion", "reno",
                     "--no-offload")
    assert len(records) == 1
    assert records[0]["congestion"] == "reno" and records[0]["ratio_vs_gloo"] > 0
    assert records[0]["offload"] is False


def test_bench_priority_saw_the_bulk():
    records = _bench("priority", "--servers", "1", "--repeat", "1", "--policies", "geryon", "--burst-bytes",
                     "65536", "--backlog-bytes", "1000000")
    assert len(records) == 1 and records[0]["bulk_bytes_seen"] > 0 and records[0]["ratio_vs_unloaded"] > 0


@pytest.mark.timing
def test_bench_allreduce_times_the_wire_ring_like_the_collectives():
    """The wire's ceiling (plain TCP streams of each ring link's bytes) is a row field, timed the same
    way: 3 ranks x 1 MB, each port carries 2/3 MB; at 100 Mbit/s that takes about 53 ms."""
    [record] = _bench("allreduce", "--workers", "3", "--sizes", "1e6", "--iters", "2", "--congestion", "reno")
    assert record["line_rate_seconds"] == pytest.approx(2 * 2 / 3 * 1e6 * 8 / 1e8)
    assert 0.5 < record["wire_ring_ratio_vs_line_rate"] < 2.0
    assert record["ratio_vs_wire_ring"] == pytest.approx(record["seconds"] / record["wire_ring_seconds"])
    assert record["gloo_ratio_vs_wire_ring"] == pytest.approx(record["gloo_seconds"] / record["wire_ring_seconds"])
    # per timed iteration and per host, each system's own times and TCP counters
    assert all(len(record[key]) == 2 for key in ("all_seconds", "gloo_all_seconds", "wire_ring_all_seconds"))
    assert record["seconds"] == sorted(record["all_seconds"])[1]
    for key in ("tcp_counters", "gloo_tcp_counters", "wire_ring_tcp_counters"):
        assert sorted(record[key]) == ["h1", "h2", "h3"] and all(c["out_segs"] > 0 for c in record[key].values())
        # ... and where packets were dropped (tests/test_bench_tcpstats.py makes drops happen)
        assert all(c[where] >= 0 for c in record[key].values()
                   for where in ("host_queue_drops", "switch_port_drops", "host_link_drops", "switch_link_drops",
                                 "ip_in_discards", "backlog_drops", "rcvq_drops", "ofo_pruned", "rcv_pruned"))
        # ... and whether the sender found a retransmission needless (reordering, not loss)
        assert all(c[what] >= 0 for c in record[key].values()
                   for what in ("dsack_recv_segs", "full_undo", "partial_undo", "dsack_undo", "sack_reorders",
                                "ts_reorders"))
    for key in ("softnet_drops", "gloo_softnet_drops", "wire_ring_softnet_drops"):
        assert record[key] >= 0, key
    # CPU per GB: the processes' own, and the whole machine's over rank 0's timed collectives
    assert record["cpu_s_per_gb"] > 0 and record["gloo_cpu_s_per_gb"] > 0
    # ... split: the user-space part (below the whole, allowing getrusage's tick-sampled split), and
    # how often a thread slept or was preempted
    for prefix in ("", "gloo_"):
        assert 0 < record[prefix + "user_cpu_s_per_gb"] <= record[prefix + "cpu_s_per_gb"] * 1.1, prefix
        assert record[prefix + "context_switches_per_gb"] > 0, prefix
    for key in ("machine_cpu_s_per_gb", "gloo_machine_cpu_s_per_gb", "wire_ring_machine_cpu_s_per_gb"):
        assert record[key] >= 0, key
    # CPU seconds the hypervisor gave another guest, per timed collective, as all_seconds are listed
    for key in ("steal_all_seconds", "gloo_steal_all_seconds", "wire_ring_steal_all_seconds"):
        assert len(record[key]) == 2 and all(s >= 0 for s in record[key]), key


def test_bench_allreduce_interleaved_times_one_collective_per_launch_in_turn():
    """--interleave: every system's roles are launched once per timed collective, the systems in turn;
    the row has as many collectives, steal figures and counters as without it."""
    [record] = _bench("allreduce", "--workers", "2", "--sizes", "1e5", "--iters", "2", "--congestion", "reno",
                      "--interleave")
    assert record["interleave"] is True and record["repeat"] == 2
    for prefix in ("", "gloo_", "wire_ring_"):
        assert len(record[prefix + "all_seconds"]) == 2 and len(record[prefix + "steal_all_seconds"]) == 2
        assert sorted(record[prefix + "tcp_counters"]) == ["h1", "h2"]
    assert record["seconds"] == sorted(record["all_seconds"])[1] and record["ratio_vs_gloo"] > 0
    assert record["cpu_s_per_gb"] > 0 and record["machine_cpu_s_per_gb"] >= 0
    # the row is what `geryon bench diff` reads: against itself every timed figure's ratio is 1
    diffs, only_a, only_b = diff_rows([record], [record])
    assert {d.figure for d in diffs} == {"seconds", "gloo_seconds", "wire_ring_seconds"} and not only_a + only_b
    assert all(d.ratio == 1.0 and d.p_value == 1.0 and (d.a_count, d.b_count) == (2, 2) for d in diffs)


def test_bench_allreduce_runs_both_systems_at_the_asked_mtu():
    records = _bench("allreduce", "--workers", "2", "--sizes", "1e5", "--iters", "1", "--congestion", "reno",
                     "--mtu", "9000", "--no-wire-ring")
    assert len(records) == 1 and records[0]["mtu"] == 9000 and records[0]["ratio_vs_gloo"] > 0
    assert "wire_ring_seconds" not in records[0] and records[0]["interleave"] is False
    assert records[0]["ack_priority"] == "own"  # the emulated cluster's default, for gloo and geryon alike
    assert records[0]["offload"] is True
    assert records[0]["header_floor_vs_line_rate"] == pytest.approx(9014 / 8948)


def test_bench_transport_ps_grid_times_only_the_iterations_after_its_warmup():
    records = _bench("transport", "--ps", "2x2", "--size-mb", "1", "--iters", "1", "--warmup", "1",
                     "--congestion", "reno", "--ack-priority", "top", "--iperf-seconds", "1")
    grid = [r for r in records if r["system"] == "ps-2x2"]
    assert len(grid) == 1 and grid[0]["warmup"] == 1 and grid[0]["mtu"] == 1500 and len(grid[0]["all_seconds"]) == 1
    assert grid[0]["ack_priority"] == "top" and len(grid[0]["timeouts_per_host"]) == 2
    assert all(counters["out_segs"] > 0 for counters in grid[0]["tcp_counters"].values())
    assert grid[0]["seconds"] <= grid[0]["per_worker_max_seconds"][0] + 1e-3   # the period never counts the skew
    assert grid[0]["ratio_vs_iperf3_bidir_sum"] > 0 and grid[0]["server_cpu_s_per_gb"] > 0
    assert grid[0]["server_minor_faults_per_gb"] > 0    # the servers' buffers are touched the first time


def test_bench_pull_runs_both_modes_on_a_real_script_with_the_same_loss():
    """`geryon bench pull`, small: the demo's CNN trains under --ps-pull end and ahead on the emulated
    cluster; every run ends with the same loss (the updates are the same, only earlier)."""
    [record] = _bench("pull", "--repeat", "1", "--iterations", "3", "--width", "8", "--hidden", "256",
                      "--bw", "1gbit")
    assert record["same_loss"] and set(record["median_s"]) == {"end", "ahead"}
    assert record["speedup_ahead"] > 0 and all(len(times) == 1 for times in record["iteration_s"].values())


def test_a_bench_killed_with_sigterm_removes_its_cluster():
    """`kill` runs the cleanup Ctrl-C runs: the bench's emulated cluster does not outlive it."""
    bench = subprocess.Popen([sys.executable, "-m", "geryon", "bench", "transport", "--size-mb", "1", "--iters",
                              "1", "--iperf-seconds", "5", "--json"], cwd=REPO, env=clean_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in bench.stderr:
            if up := re.search(r"cluster (\w+) up: ", line):
                name = up.group(1)
                break
        else:
            pytest.fail("the bench never brought its cluster up")
        assert state.record_exists(name) and fabric.list_netns(f"gy{name}-")
        bench.send_signal(signal.SIGTERM)          # during the iperf3 baseline
        assert bench.wait(timeout=60) == 130
        assert "geryon: interrupted" in bench.stderr.read()
        assert not fabric.list_netns(f"gy{name}-")
        assert not state.record_exists(name)
    finally:
        bench.kill()
        bench.wait()
        bench.stderr.close()
