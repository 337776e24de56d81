"""The flow-level simulator: allocation, hand-computable jobs, aggregate vs exact, CLI, compare."""

import json

import numpy as np
import pytest

from geryon.categorize.profiles import LayerProfile, ProfileLayer
from geryon.cli import main
from geryon.errors import ConfigError
from geryon.sim.compare import compare, load_rows, port_connections
from geryon.sim.fabric import GroupSet, allocate, build_fabric
from geryon.sim.job import PSJob
from geryon.sim.queues import PortQueues, QueueTable, emulated_inflight, emulated_queues
from geryon.sim.scenario import SimSetting, simulate
from geryon.sim.workload import build_workload

GBIT = 1e9


def profile(layers):
    """layers: (name, type, forward ms, backward ms, bytes)."""
    return LayerProfile("toy", 32, "test", tuple(
        ProfileLayer(n, t, f * 1e6, b * 1e6, p) for n, t, f, b, p in layers))


def test_max_min_and_strict_priority_on_a_shared_port():
    fabric = build_fabric(3, 3, "colocated", 8 * GBIT)   # 1 GB/s per link
    # two push groups into server 0 (2 remote members each on host 0's down link)
    groups = GroupSet(fabric, host=[0, 0], pull=[False, False], cls=[0, 0])
    rates = allocate(groups, np.array([0, 1]))
    assert rates == pytest.approx([0.25e9, 0.25e9])
    groups = GroupSet(fabric, host=[0, 0], pull=[False, False], cls=[0, 1])
    assert allocate(groups, np.array([0, 1])) == pytest.approx([0.5e9, 0.0])
    # a floor guarantees the low class its share
    assert allocate(groups, np.array([0, 1]), floor=0.2) == pytest.approx([0.4e9, 0.1e9])


def test_single_worker_iteration_is_compute():
    prof = profile([("c1", "Conv2D", 2, 4, 1000), ("d1", "Dense", 1, 3, 5000)])
    fabric = build_fabric(1, 1, "colocated", GBIT)
    workload = build_workload(prof, "geryon", 1, 1024)
    result = PSJob(workload, fabric, [0.002, 0.001], [0.004, 0.003]).run(3)
    assert result.iteration_s() == pytest.approx(0.010)


@pytest.mark.parametrize("exact", [False, True])
def test_two_workers_one_tensor_known_time(exact):
    # vanilla: the tensor lives on server 0; worker 1 pushes 1 MB then pulls it back at 1 GB/s
    prof = profile([("d1", "Dense", 10, 20, 1_000_000)])
    fabric = build_fabric(2, 2, "colocated", 8 * GBIT)
    workload = build_workload(prof, "vanilla", 2, 1 << 30)
    result = PSJob(workload, fabric, [0.010], [0.020], exact=exact).run(4)
    assert result.iteration_s() == pytest.approx(0.030 + 2 * 0.001, rel=1e-6)


@pytest.mark.parametrize("mtu, frame_bytes, payload", [(1500, 38, 1448 / 1538), (1500, 14, 1448 / 1514),
                                                       (9000, 38, 8948 / 9038)])
def test_parameters_move_at_the_line_rate_less_the_packet_headers(mtu, frame_bytes, payload):
    # the known-time job above through simulate(): 2 workers, 1 MB pushed then pulled back over one
    # 8 Gbit/s link, at the payload rate a real Ethernet wire (38 bytes a frame beyond the IP packet),
    # an emulated port (14: HTB on a veth counts the Ethernet header) or jumbo frames leave
    prof = profile([("d1", "Dense", 10, 20, 1_000_000)])
    setting = SimSetting(model="toy", bw_bps=8 * GBIT, workers=2, compute_scale=1.0, iterations=4,
                         slice_params=1 << 28, exact=True, mtu=mtu, frame_bytes=frame_bytes)
    assert setting.payload_bps == pytest.approx(8 * GBIT * payload)
    row = simulate(setting, "vanilla", prof)
    assert row["iteration_s"] == pytest.approx(0.030 + 2 * 0.001 / payload, rel=1e-6)


def test_compare_counts_an_emulated_ports_frames():
    from geryon.sim.compare import setting_for
    from geryon.sim.scenario import EMULATED_FRAME_BYTES, ETHERNET_FRAME_BYTES
    emulated = setting_for({"model": "vgg19", "link_rate_bits": 1e8, "size_scale": 0.01}, SimSetting())
    assert emulated.frame_bytes == EMULATED_FRAME_BYTES and emulated.bw_bps == pytest.approx(1e10)
    # bench paper's rows carry the paper-scale rate beside the emulated port's
    row = {"model": "vgg19", "bw_bits": 1e10, "link_rate_bits": 1e8, "size_scale": 0.01}
    assert setting_for(row, SimSetting()).frame_bytes == EMULATED_FRAME_BYTES
    real = setting_for({"model": "vgg19", "bw_bits": 1e10}, SimSetting())
    assert real.frame_bytes == ETHERNET_FRAME_BYTES
    with pytest.raises(ConfigError, match="--mtu"):
        SimSetting(mtu=100)


def test_aggregate_matches_exact_on_a_symmetric_job():
    prof = profile([("c1", "Conv2D", 3, 6, 400_000), ("c2", "Conv2D", 2, 4, 800_000),
                    ("d1", "Dense", 1, 2, 4_000_000)])
    fabric = build_fabric(4, 4, "separate", 8 * GBIT)
    for policy in ("slicing", "endhost", "geryon"):
        workload = build_workload(prof, policy, 4, 250_000)
        a = PSJob(workload, fabric, [0.003, 0.002, 0.001], [0.006, 0.004, 0.002]).run(4)
        e = PSJob(workload, fabric, [0.003, 0.002, 0.001], [0.006, 0.004, 0.002], exact=True).run(4)
        assert a.iteration_s() == pytest.approx(e.iteration_s(), rel=0.02), policy


def test_geryon_beats_fifo_when_the_network_binds():
    prof = profile([("c1", "Conv2D", 5, 10, 200_000), ("c2", "Conv2D", 5, 10, 200_000),
                    ("d1", "Dense", 1, 1, 8_000_000)])
    fabric = build_fabric(4, 4, "colocated", 8 * GBIT)
    times = {}
    for policy in ("slicing", "geryon"):
        workload = build_workload(prof, policy, 4, 100_000)
        times[policy] = PSJob(workload, fabric, [0.005, 0.005, 0.001], [0.01, 0.01, 0.001]).run(4).iteration_s()
    assert times["geryon"] < times["slicing"]


def test_leafspine_oversubscription_slows_the_job():
    prof = profile([("c1", "Conv2D", 5, 10, 2_000_000), ("d1", "Dense", 1, 1, 8_000_000)])
    times = []
    for ratio in (1, 8):
        fabric = build_fabric(8, 8, "colocated", 8 * GBIT, "leafspine", ratio, hosts_per_leaf=4)
        workload = build_workload(prof, "endhost", 8, 500_000)
        times.append(PSJob(workload, fabric, [0.005, 0.001], [0.01, 0.001]).run(3).iteration_s())
    assert times[1] > times[0]


def test_bad_settings_are_typed_errors():
    with pytest.raises(ConfigError):
        SimSetting(workers=2000)
    with pytest.raises(ConfigError):
        build_fabric(2, 2, "sideways", GBIT)
    with pytest.raises(ConfigError):
        PSJob(build_workload(profile([("d", "Dense", 1, 1, 10)]), "slicing", 1, 1024),
              build_fabric(100, 1, "separate", GBIT), [0.001], [0.001], exact=True)
    with pytest.raises(ConfigError):
        PSJob(build_workload(profile([("d", "Dense", 1, 1, 10)]), "slicing", 1, 1024),
              build_fabric(2, 1, "separate", GBIT), [0.001], [0.001], latency_s=-1)


def test_compare_reads_bench_paper_rows(tmp_path):
    # a hand-made bench paper result: 2 workers, 1% sizes on 100 Mbit/s ports = 10 Gbit/s equivalent
    rows = [{"model": "vgg19", "link": "10gbe", "policy": "vanilla", "workers": 2, "layout": "colocated",
             "iteration_s": 2.0, "scaling_efficiency": 0.5, "time_scale": 9.5, "size_scale": 0.01,
             "bw_bits": 10e9},
            {"model": "vgg19", "policy": "geryon", "workers": 2, "iteration_s": 2.0, "time_scale": 9.5,
             "link_rate_bits": 100e6},   # optional fields missing: paper.json's settings fill them
            {"model": "vgg19", "policy": "control-nolimit", "iteration_s": 1.4, "compute_s": 1.2}]
    path = tmp_path / "paper.json"
    path.write_text(json.dumps({"settings": {"size_scale": 0.01, "wall_scale": 1.0,
                                             "slice_params": 1048576}, "rows": rows}))
    results, skipped = compare(load_rows(path), SimSetting(iterations=2))
    assert skipped == 1 and len(results) == 2
    for r in results:
        assert r["simulated_s"] > 0 and r["error"] == pytest.approx(r["simulated_s"] / 2.0 - 1)
    assert {r["time_scale"] for r in results} == {9.5}
    for r in results:   # the control row's harness cost (1.4 - 1.2 s) is two frame latencies
        assert r["harness_s"] == pytest.approx(0.2) and r["latency_s"] == pytest.approx(0.1)
        # NOTSENT_LOWAT plus what a bbr connection keeps in flight with 2 connections into a port
        # (2 workers colocated: one push into the server, one pull into the worker), paper bytes
        assert r["backlog_bytes"] == pytest.approx((16384 + emulated_inflight("bbr", 100e6, 2)) / 0.01)
        assert r["fluid_error"] == pytest.approx(r["fluid_s"] / 2.0 - 1)
        assert r["simulated_s"] > r["fluid_s"]
        assert r["exact"] and r["aggregate_error"] == pytest.approx(r["aggregate_s"] / 2.0 - 1)
    assert results[0]["simulated_s"] == pytest.approx(results[1]["simulated_s"], rel=0.5)
    lines = path.with_suffix(".jsonl")
    lines.write_text("\n".join(json.dumps(r) for r in rows))
    assert len(load_rows(lines)) == 3


def test_sim_cli_json_rows(capsys):
    assert main(["sim", "--model", "vgg19", "--compute-scale", "9.5", "--iterations", "2",
                 "--policy", "vanilla,geryon", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r["policy"] for r in rows] == ["vanilla", "geryon"]
    assert rows[0]["paper_scaling_efficiency"] == pytest.approx(0.269)
    assert 0 < rows[0]["scaling_efficiency"] <= 1 and rows[1]["speedup_vs_vanilla"] > 1


def test_calibrated_scale_hits_the_paper_cell():
    from geryon.sim.scenario import calibrate
    scale = calibrate()
    row = simulate(SimSetting(compute_scale=scale, iterations=4), "vanilla")
    assert row["compute_s"] / row["iteration_s"] == pytest.approx(0.269, abs=0.002)


def test_sim_cli_slice_table(capsys):
    assert main(["sim", "--model", "vgg19", "--policy", "vanilla", "--compute-scale", "9.5",
                 "--iterations", "2", "--slice-table", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    table = [r for r in rows if r.get("table") == "slicing"]
    assert [r["slice_params"] for r in table] == [1024 * 1024, 512 * 1024, 256 * 1024]
    assert all(r["geryon_images_per_s"] > 0 and r["paper_geryon"] > 0 for r in table)


def test_analytic_estimate_and_potential_speedup():
    from geryon.sim.scenario import analytic_s, effective_bandwidth, potential_speedup
    setting = SimSetting(model="vgg19", compute_scale=9.5, workers=8)
    assert effective_bandwidth(setting) == pytest.approx(10e9 * 1448 / 1538 * 8 / 14)
    compute = setting.profile().forward_ns * 9.5e-9 + setting.profile().backward_ns * 9.5e-9
    assert analytic_s(setting, "geryon") >= compute * 0.999
    assert analytic_s(setting, "vanilla") >= analytic_s(setting, "geryon")
    # forward-order pulls never lose to reverse order; the gain vanishes at high bandwidth
    assert potential_speedup(setting.profile(), 10e9, 9.5) > 1.2
    assert potential_speedup(setting.profile(), 400e9, 9.5) == pytest.approx(1.0, abs=0.02)


def test_whatif_point_fields():
    from geryon.sim.whatif import point
    row = point(SimSetting(model="resnet50", compute_scale=9.5, iterations=1))
    assert row["gain"] == pytest.approx(row["endhost_s"] / row["geryon_s"])
    assert 0 < row["efficiency_geryon"] <= 1.0 + 1e-9


def test_byte_placement_balances_servers():
    from geryon.sim.scenario import SimSetting as Setting
    prof = Setting(model="resnet50").profile()
    count = build_workload(prof, "slicing", 8, 4 << 20).bytes_per_server(8)
    balanced = build_workload(prof, "slicing", 8, 4 << 20, placement="bytes").bytes_per_server(8)
    assert balanced.max() - balanced.min() < count.max() - count.min()


HOL_PROFILE = [("c1", "Conv2D", 1, 0.5, 1000), ("d1", "Dense", 1, 0, 1_000_000),
               ("d2", "Dense", 1, 1, 1_000_000)]


@pytest.mark.parametrize("backlog, period", [(0, 0.006001), (250_000, 0.006001), (750_000, 0.007001),
                                             (10_000_000, 0.007001)])
def test_socket_backlog_commits_frames_before_an_urgent_one_arrives(backlog, period):
    # worker 1 pushes d2 then d1 (ready together) and c1 0.5 ms later, 1 ms per MB, over one
    # connection ordered by urgency (endhost). With at most 250 KB in the socket, c1 overtakes d1
    # (queued, not yet committed): pulls d2, c1, d1 -> forward restarts 6 ms (+ c1's 1 us) after it
    # started. With 750 KB or more d1 is in the socket before c1 comes: c1 last both ways -> 7 ms.
    prof = profile(HOL_PROFILE)
    fabric = build_fabric(2, 1, "colocated", 8 * GBIT)
    workload = build_workload(prof, "endhost", 1, 1 << 30)
    forward, backward = [0.001] * 3, [0.0005, 0.0, 0.001]
    result = PSJob(workload, fabric, forward, backward, backlog_bytes=backlog).run(4)
    assert result.iteration_s() == pytest.approx(period, rel=1e-6)


def test_frame_latency_adds_to_each_hop():
    prof = profile([("d1", "Dense", 10, 20, 1_000_000)])
    fabric = build_fabric(2, 2, "colocated", 8 * GBIT)
    workload = build_workload(prof, "vanilla", 2, 1 << 30)
    result = PSJob(workload, fabric, [0.010], [0.020], latency_s=0.005).run(4)
    assert result.iteration_s() == pytest.approx(0.030 + 2 * 0.001 + 2 * 0.005, rel=1e-6)


def test_a_lone_connection_waits_behind_no_queue():
    # one connection per link: whatever it has queued is its own earlier bytes, which the fluid
    # model already serves before its frame's last byte -- the known time of the plain job
    prof = profile([("d1", "Dense", 10, 20, 1_000_000)])
    fabric = build_fabric(2, 2, "colocated", 8 * GBIT)
    workload = build_workload(prof, "vanilla", 2, 1 << 30)
    result = PSJob(workload, fabric, [0.010], [0.020], queues=QueueTable.per_flow(100_000)).run(4)
    assert result.iteration_s() == pytest.approx(0.030 + 2 * 0.001, rel=1e-6)


def test_port_queues_count_connections_per_class():
    fabric = build_fabric(4, 4, "colocated", 8 * GBIT)    # 1 GB/s links
    # pushes into server 0 (class 0) and pulls from server 1 (class 0) and server 2 (class 1)
    groups = GroupSet(fabric, host=[0, 1, 2], pull=[False, True, True], cls=[0, 0, 1])
    ports = PortQueues(groups, QueueTable.per_flow(1000, 2500))
    ports.update(np.array([0, 1, 2]))
    # host 1's up link: its push to server 0 + 3 pulls of server 1 = 4 class-0 connections, capped
    assert ports.up[0, 1] == 2500
    assert ports.up[0, 2] == 1000 and ports.up[1, 2] == 2500       # push; 3 class-1 pulls
    # a class-1 pull from server 2 waits only behind class-1 bytes of the other connections:
    # host 2's up link 2500 - its own 2500/3; the worker down links hold 1 class-1 pull each (its own)
    assert ports.delay(2) == pytest.approx((2500 - 2500 / 3) * 1e-9)
    # a connection holds at most its backlog in the queue: 100 bytes committed per connection
    ports.update(np.array([0, 1, 2]), backlog=np.array([100.0, 100.0, 100.0]))
    assert ports.up[0, 1] == pytest.approx(400) and ports.up[1, 2] == pytest.approx(300)
    assert ports.delay(2, backlog=100.0) == pytest.approx(200 * 1e-9)


def test_queue_table_interpolates_and_saturates():
    table = QueueTable(((2, 100, 200), (4, 100, 1000)))
    assert table.bytes(np.array([0, 1, 3, 9]), down=True) == pytest.approx([0, 100, 600, 1000])
    assert table.bytes(np.array([1, 9]), down=False) == pytest.approx([50, 100])
    assert table.scaled(10).rows[-1] == (4, 1000, 10000)
    with pytest.raises(ConfigError):
        QueueTable(((4, 1, 1), (2, 1, 1)))


def test_sim_cli_emulated_tcp_slows_fifo_more_than_priority(capsys):
    rows = {}
    for extra in ([], ["--emulated-tcp", "0.01"]):
        assert main(["sim", "--model", "vgg19", "--compute-scale", "10", "--iterations", "2",
                     "--policy", "endhost,geryon", "--json", *extra]) == 0
        rows[bool(extra)] = {r["policy"]: r["iteration_s"] for r in map(
            json.loads, (l for l in capsys.readouterr().out.splitlines() if l.startswith("{")))}
    # the standing queues urgent frames meet under FIFO cost endhost more than geryon
    assert rows[True]["endhost"] - rows[False]["endhost"] > rows[True]["geryon"] - rows[False]["geryon"] > 0
    assert main(["sim", "--emulated-tcp", "2", "--compute-scale", "10"]) != 0
    assert "--emulated-tcp" in capsys.readouterr().err


def test_compare_replays_bench_paper_variants():
    from geryon.sim.compare import variant

    assert variant("geryon+urgency") == ("geryon", {"within_class": "urgency"})
    assert variant("endhost+bytes+fifo") == ("endhost", {"placement": "bytes", "within_class": "fifo"})
    assert variant("geryon+threshold") == (None, {}) and variant("control-nolimit") == (None, {})


@pytest.mark.parametrize("exact", [False, True])
def test_pulling_ahead_returns_the_fc_parameters_during_the_backward_pass(exact):
    """`pull_ahead` (bench paper's --pull ahead): the big dense layer, pushed first, comes back while
    the conv layer's backward still runs, so less of its pull is exposed after the backward ends."""
    prof = profile([("c1", "Conv2D", 10, 30, 1000), ("d1", "Dense", 1, 10, 20_000_000)])
    fabric = build_fabric(2, 2, "colocated", 8 * GBIT)      # 1 GB/s: d1 is 20 ms each way
    workload = build_workload(prof, "vanilla", 2, 1 << 30)

    def iteration(ahead):
        return PSJob(workload, fabric, [0.010, 0.001], [0.030, 0.010], exact=exact,
                     pull_ahead=ahead).run(4).iteration_s()

    end, ahead = iteration(False), iteration(True)
    # end: d1 is pulled only after the backward (41 ms); its 20 ms outlast c1's 10 ms forward by 10
    assert end == pytest.approx(0.051 + 0.010, rel=1e-3)
    # ahead: d1 is pushed 10 ms into the backward, updated at 30 ms, back at 50 ms: before the
    # forward needs it (41 + 10 ms), so the iteration is its compute
    assert ahead == pytest.approx(0.051, rel=1e-3)


def test_measured_queue_tables_are_found_per_congestion_control_at_the_nearest_rate():
    """compare.py models a row's congestion control with its own measured table (bbr at 100 and 400
    Mbit/s, cubic at 100 Mbit/s), or none where nothing was measured."""
    cubic = emulated_queues("cubic", 100e6)
    assert cubic is emulated_queues("cubic", 400e6)              # the only cubic rate measured
    assert cubic.bytes(np.array([7]), down=True)[0] > 10 * emulated_queues("bbr", 100e6).bytes(
        np.array([7]), down=True)[0]                            # cubic fills the port into a host
    assert emulated_queues("bbr", 350e6) is not emulated_queues("bbr", 100e6)
    assert emulated_queues("reno", 100e6) is None


def test_measured_bytes_in_flight_interpolate_between_connection_counts():
    """compare.py adds a connection's bytes in flight (queueprobe's `ss -tin` samples) to the socket
    backlog: linear between measured connection counts, flat past them, None where unmeasured."""
    at4, at7 = emulated_inflight("bbr", 100e6, 4), emulated_inflight("bbr", 100e6, 7)
    assert emulated_inflight("bbr", 100e6, 5) == pytest.approx(at4 + (at7 - at4) / 3)
    assert emulated_inflight("bbr", 100e6, 100) == emulated_inflight("bbr", 100e6, 14)
    assert emulated_inflight("bbr", 380e6, 7) == emulated_inflight("bbr", 400e6, 7) != at7
    assert emulated_inflight("cubic", 100e6, 7) > 10 * at7      # cubic's deep queues
    assert emulated_inflight("reno", 100e6, 7) is None


def test_port_connections_per_layout():
    assert port_connections(SimSetting(workers=8)) == 14
    assert port_connections(SimSetting(workers=1)) == 1
    assert port_connections(SimSetting(workers=8, servers=2, layout="separate")) == 8


@pytest.mark.root
@pytest.mark.slow
def test_queueprobe_samples_the_port_backlog_and_the_bytes_in_flight():
    """The probe behind EMULATED_QUEUES and EMULATED_INFLIGHT, on a real emulated port: two bulk bbr
    flows from two hosts into one; its namespaces are gone afterwards."""
    from geryon.emulate import fabric
    from geryon.sim.queueprobe import probe

    before = set(fabric.list_netns("gyq"))
    row = probe(2, "spread", "bbr", "100mbit", duration=4.0, senders=2)
    assert row["samples"] >= 5 and row["flows"] == 2
    # at least a few full-size segments in flight per connection, at most a second of the port
    assert 3 * 1448 < row["inflight_per_flow_bytes"] < 100e6 / 8
    assert 0 <= row["mean_bytes"] < 100e6 / 8
    assert set(fabric.list_netns("gyq")) <= before
