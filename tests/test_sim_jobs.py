"""geryon sim --jobs: the fluid model of job mixes on one fabric. Its ports serve classes as the Linux target
programs them, flows in one class share by the bytes each keeps in flight, a vanilla PS tensor moves whole on
its server's connection, a ring's collectives cost their steps, a job alone on a fast fabric is
compute-bound, a ring on a slow one is bandwidth-bound, the background keeps its floor, and a tenants bench
record compares with its own simulation."""

import argparse
import json
from dataclasses import replace

import pytest

from geryon.errors import ConfigError
from geryon.netconf.tenants import BACKGROUND, BULK, URGENT
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.replay import BENCH_SPIN_MARGIN_S
from geryon.sim.jobs import (EMULATED_BACKGROUND_WINDOW, EMULATED_RING_STEP_S, POLICIES, RING_STEP_WAKEUPS, JobMix,
                             JobsSetting, _Chunk, _Fabric, _Sim, compare_record, run_jobs, setting_from_record,
                             simulate_jobs)

PS_AND_RING = (JobMix("vgg19", "ps"), JobMix("resnet50", "allreduce"))


def chunk(cls, connections=1, window=1.0):
    return _Chunk(0, "pull", 0, cls, (0,), 1e9, ("down",), connections, window=window)


def test_a_port_serves_classes_as_linux_htb_does():
    setting = JobsSetting(jobs=PS_AND_RING, rate_bps=100e6)
    fabric = _Fabric(setting, "fabric")
    urgent, bulk, background = chunk(URGENT), chunk(BULK), chunk(BACKGROUND)
    shares = fabric.port_shares("down", [urgent, bulk, background])
    capacity = fabric.capacity["down"]
    assert shares[id(background)] == pytest.approx(0.10 * capacity)   # its floor, under the strict class
    assert shares[id(urgent)] > 0.88 * capacity and shares[id(bulk)] < 0.01 * capacity
    assert sum(shares.values()) == pytest.approx(capacity)
    # unmarked (endhost): one class, shared per TCP connection
    flat = _Fabric(setting, "endhost")
    ps, ring = chunk(BULK, connections=3), chunk(BULK)
    shares = flat.port_shares("down", [ps, ring])
    assert shares[id(ps)] == pytest.approx(3 * shares[id(ring)]) and sum(shares.values()) == pytest.approx(capacity)


def test_one_class_shares_a_port_by_the_bytes_each_connection_keeps_in_flight():
    setting = JobsSetting(jobs=PS_AND_RING, rate_bps=100e6)
    capacity = _Fabric(setting, "vanilla").capacity["down"]
    ps, ring, background = chunk(BULK, connections=2), chunk(BULK), chunk(BULK, window=2.7)
    shares = _Fabric(setting, "vanilla").port_shares("down", [ps, ring, background])
    assert shares[id(background)] == pytest.approx(capacity * 2.7 / 5.7)
    assert shares[id(ps)] == pytest.approx(2 * shares[id(ring)]) and sum(shares.values()) == pytest.approx(capacity)
    # under fabric classes the background has a class of its own: its window does not buy it a share
    urgent = chunk(URGENT)
    shares = _Fabric(setting, "fabric").port_shares("down", [urgent, chunk(BACKGROUND, window=2.7)])
    assert shares[id(urgent)] == pytest.approx(0.9 * capacity, rel=0.01)


def test_a_vanilla_ps_tensor_moves_whole_on_its_servers_connection():
    setting = JobsSetting(jobs=(JobMix("vgg19", "ps"),), workers=4, size_scale=0.01)
    vanilla, endhost = _Sim(setting, "vanilla").jobs[0], _Sim(setting, "endhost").jobs[0]
    for layer in vanilla.bits:      # vgg19: every layer has parameters, tensor i is layer i
        assert vanilla.ps_flow(layer) == (1, layer % 4)       # round robin by tensor, one connection
        assert endhost.ps_flow(layer) == (4, 0)               # sliced over the 4 servers at once


@pytest.mark.parametrize("workers", [2, 4])
def test_a_rings_collectives_each_cost_their_2_w_minus_1_steps(workers):
    """A ring with no bytes to speak of and a step cost larger than any backward layer: the collectives
    queue behind each other, so the next forward waits for all of them, collectives x steps x cost after
    the first gradient."""
    step = 2e-3
    setting = JobsSetting(jobs=(JobMix("resnet50", "allreduce"),), workers=workers, rate_bps=400e9,
                          size_scale=1e-6, background=False, ring_step_s=step, iterations=4)
    (job,) = simulate_jobs(setting, "vanilla")["jobs"]
    profile = resolve_profile("resnet50", batch=32)
    collectives = sum(1 for layer in profile.layers if layer.param_bytes > 0)
    backward_after_first_gradient = (profile.backward_ns - profile.layers[-1].backward_ns) * 1e-9
    expected = job["compute_s"] + collectives * 2 * (workers - 1) * step - backward_after_first_gradient
    assert job["median_iteration_s"] == pytest.approx(expected, rel=1e-3)
    free = simulate_jobs(replace(setting, ring_step_s=0.0), "vanilla")["jobs"][0]
    assert free["median_iteration_s"] == pytest.approx(job["compute_s"], rel=0.01)


def test_a_measured_cpu_wait_makes_every_ring_step_wait_as_long_as_a_replay_wake_up():
    """The replay wakes once per layer and direction; each ring step's thread waits as long as one of those
    wake-ups. With a step far longer than any layer, the next forward waits for the last collective."""
    wake = 2e-3
    layers = len(resolve_profile("resnet50", batch=32).layers)      # every resnet50 layer has parameters
    setting = JobsSetting(jobs=(JobMix("resnet50", "allreduce"),), workers=2, rate_bps=400e9, size_scale=1e-6,
                          background=False, cpu_wait_s=(wake * 2 * layers,), iterations=4)
    with_wait = simulate_jobs(setting, "vanilla")["jobs"][0]["median_iteration_s"]
    with_step = simulate_jobs(replace(setting, cpu_wait_s=None, ring_step_s=wake), "vanilla")["jobs"][0]
    # the same ring holds; the wait also delays the replay's wake-ups, each within one wait
    assert with_step["median_iteration_s"] < with_wait < with_step["median_iteration_s"] + 3 * wake


def test_a_measured_wait_per_wake_up_delays_each_ring_step_by_its_two_threads_wake_ups():
    """Counted wake-ups: a ring step wakes its receiving and its sending thread, each waiting the measured
    wait of one wake-up; it holds the job as a step cost of twice that would."""
    wait = 1e-3
    setting = JobsSetting(jobs=(JobMix("resnet50", "allreduce"),), workers=2, rate_bps=400e9, size_scale=1e-6,
                          background=False, wake_wait_s=(0.0,), step_wait_s=(wait,), iterations=4)
    waited = simulate_jobs(setting, "vanilla")["jobs"][0]
    stepped = simulate_jobs(replace(setting, wake_wait_s=None, step_wait_s=None,
                                    ring_step_s=RING_STEP_WAKEUPS * wait), "vanilla")["jobs"][0]
    assert waited["median_iteration_s"] == pytest.approx(stepped["median_iteration_s"], rel=1e-9)


def test_a_measured_wait_per_wake_up_is_what_each_replay_wake_up_waits():
    """The same replay wake-ups as a per-iteration wait spread over VGG-19's 2 x 19 of them."""
    per_wake_up = 5e-3
    setting = JobsSetting(jobs=(JobMix("vgg19", "ps"),), rate_bps=400e9, size_scale=0.001, background=False,
                          wake_wait_s=(per_wake_up,), step_wait_s=(0.0,), iterations=4)
    counted = simulate_jobs(setting, "vanilla")["jobs"][0]["median_iteration_s"]
    spread = simulate_jobs(replace(setting, wake_wait_s=None, step_wait_s=None, cpu_wait_s=(per_wake_up * 2 * 19,)),
                           "vanilla")["jobs"][0]["median_iteration_s"]
    assert counted == pytest.approx(spread, rel=1e-9)
    assert counted > simulate_jobs(replace(setting, wake_wait_s=(0.0,)), "vanilla")["jobs"][0]["median_iteration_s"]


def test_a_job_alone_on_a_fast_fabric_is_compute_bound():
    setting = JobsSetting(jobs=(JobMix("resnet50", "ps"),), rate_bps=400e9, size_scale=0.001, background=False)
    result = simulate_jobs(setting, "vanilla")
    (job,) = result["jobs"]
    assert job["median_iteration_s"] == pytest.approx(job["compute_s"], rel=0.01)
    assert result["aggregate_utilisation"] == pytest.approx(1.0, abs=0.01) and result["background_share"] is None


def vgg19_alone_with_a_cpu_wait(per_wake_up):
    """A VGG-19 PS job alone on a fast fabric whose replay waits `per_wake_up` seconds for a CPU at each of
    its 2 x 19 wake-ups per iteration."""
    setting = JobsSetting(jobs=(JobMix("vgg19", "ps"),), rate_bps=400e9, size_scale=0.001, background=False,
                          cpu_wait_s=(per_wake_up * 2 * 19,), iterations=4)
    (job,) = simulate_jobs(setting, "vanilla")["jobs"]
    return job, resolve_profile("vgg19", batch=32)


def test_a_cpu_wait_within_the_replays_busy_wait_costs_only_the_wake_up_from_a_blocked_pull():
    job, _ = vgg19_alone_with_a_cpu_wait(BENCH_SPIN_MARGIN_S / 2)
    # the first layer waits for its pull (just asked for), and wakes a CPU wait late; every other wake-up
    # is within the busy-wait before its deadline
    assert job["median_iteration_s"] == pytest.approx(job["compute_s"] + BENCH_SPIN_MARGIN_S / 2, rel=1e-3)
    assert job["utilisation"] == pytest.approx(job["compute_s"] / job["median_iteration_s"], rel=1e-6)


def test_a_late_wake_up_is_absorbed_by_the_deadlines_after_it_not_summed():
    """A CPU wait longer than a whole pass: after its first late wake-up each pass is behind its deadline
    chain and runs on without sleeping, so the iteration is three waits, not 38."""
    wait = 1.0
    job, profile = vgg19_alone_with_a_cpu_wait(wait)
    first_forward, first_backward = profile.layers[0].forward_ns * 1e-9, profile.layers[-1].backward_ns * 1e-9
    # blocked pull + first forward layer's wake-up + first backward layer's wake-up
    expected = wait + (first_forward + wait - BENCH_SPIN_MARGIN_S) + (first_backward + wait - BENCH_SPIN_MARGIN_S)
    assert job["median_iteration_s"] == pytest.approx(expected, rel=1e-3)
    assert job["compute_s"] == pytest.approx((profile.forward_ns + profile.backward_ns) * 1e-9)


def test_a_ring_on_a_slow_fabric_waits_for_its_bytes():
    setting = JobsSetting(jobs=(JobMix("resnet50", "allreduce"),), workers=4, rate_bps=10e6, size_scale=0.01,
                          background=False)
    result = simulate_jobs(setting, "vanilla")
    ring_bits = resolve_profile("resnet50", batch=32).param_bytes * 0.01 * 8 * 2 * 3 / 4
    assert result["jobs"][0]["median_iteration_s"] >= ring_bits / setting.payload_bps


def test_background_keeps_its_floor_and_fabric_classes_help_the_jobs():
    setting = JobsSetting(jobs=PS_AND_RING, workers=2, rate_bps=50e6, size_scale=0.01)
    results = {policy: simulate_jobs(setting, policy) for policy in POLICIES}
    assert results["fabric"]["background_share"] >= 0.10
    assert results["fabric"]["aggregate_utilisation"] > results["endhost"]["aggregate_utilisation"]


def test_up_to_1024_hosts_on_an_oversubscribed_leaf_spine():
    setting = JobsSetting(jobs=PS_AND_RING, workers=512, rate_bps=100e9, oversubscription=4, iterations=3)
    assert setting.hosts == 1024
    result = simulate_jobs(setting, "fabric")
    assert all(0 < j["utilisation"] <= 1 for j in result["jobs"])
    with pytest.raises(ConfigError, match="at most 1024"):
        replace(setting, workers=513)


def test_segments_start_together_and_steady_state_keeps_every_job_running():
    setting = JobsSetting(jobs=PS_AND_RING, workers=2, rate_bps=200e6, size_scale=0.01, iterations=4)
    steady = simulate_jobs(setting, "fabric")
    segments = simulate_jobs(replace(setting, segments=True), "fabric")
    # the ring job finishes first; in a segment the PS job's last iterations then run alone, faster
    assert segments["jobs"][0]["median_iteration_s"] < steady["jobs"][0]["median_iteration_s"]


def test_a_segments_measured_iterations_start_once_the_warm_ups_transfers_have_landed():
    """The bench starts the background between the warm-up and the measured run: the first measured
    iteration finds every parameter in place and is compute only; the next ones wait for the network."""
    setting = JobsSetting(jobs=PS_AND_RING, workers=2, rate_bps=200e6, size_scale=0.01, iterations=4, warmup=2,
                          segments=True, background_window=EMULATED_BACKGROUND_WINDOW)
    sim = _Sim(setting, "endhost")
    sim.run()
    for job in sim.jobs:
        first, *rest = job.steps[setting.warmup:]
        assert first == pytest.approx(job.compute_s, rel=1e-6)
        assert min(rest) > 1.2 * job.compute_s


def tenants_record(setting: JobsSetting, models, policies=("endhost", "fabric"), waits=None) -> dict:
    """A `bench tenants` record whose every repetition is the simulation of `setting` (with `waits`: one
    repetition per entry, each with those JobsSetting CPU-wait fields and their per-job record fields)."""
    rows = []
    for policy in policies:
        for fields in waits or [{}]:
            r = simulate_jobs(replace(setting, **{k: v for k, v in fields.items() if k != "record"}), policy)
            rows.append({"policy": policy, "aggregate_utilisation": r["aggregate_utilisation"],
                         "background_share": r["background_share"],
                         "jobs": [{"job": j["job"], "median_iteration_s": j["median_iteration_s"],
                                   "utilisation": j["utilisation"], **per_job}
                                  for j, per_job in zip(r["jobs"], fields.get("record", [{}] * 2))]})
    return {"settings": {"models": list(models), "workers": 2, "rate": "200mbit", "size_scale": 0.01,
                         "time_scale": 1.0, "background": True, "background_percent": 10, "iterations": 10,
                         "warmup": 2},
            "compute_s": [[0.15, 0.15], [0.1, 0.1]], "rows": rows,
            "load_average": {"before": 1.0, "after": 1.0}, "cpus": 2}


RECORDED = JobsSetting(jobs=tuple(JobMix.parse(m) for m in ("vgg19", "resnet50:allreduce")), workers=2,
                       rate_bps=200e6, size_scale=0.01, frame_bytes=14, compute_s=(0.15, 0.1), warmup=2,
                       segments=True, background_window=EMULATED_BACKGROUND_WINDOW,
                       ring_step_s=EMULATED_RING_STEP_S)


def test_a_record_compares_with_its_own_simulation(tmp_path, capsys):
    models = ("vgg19", "resnet50:allreduce")
    record = tenants_record(RECORDED, models)
    assert setting_from_record(record) == RECORDED
    rows = compare_record(record)
    assert [r["job"] for r in rows] == ["vgg19-ps-0", "resnet50-allreduce-1", "aggregate"] * 2
    assert all(r.get("iteration_error", 0) == pytest.approx(0, abs=1e-9) for r in rows)
    assert all(r.get("utilisation_error", 0) == pytest.approx(0, abs=1e-9) for r in rows)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    args = argparse.Namespace(jobs="", compare=[str(path)], json=False, cpu_wait=False)   # sim --jobs --compare
    assert run_jobs(args) == 0
    assert "largest error: iteration time 0.0%" in capsys.readouterr().out


def test_each_repetition_is_simulated_with_its_own_cpu_waits_and_records_pool_their_repetitions():
    """Three repetitions, each measured with other CPU waits: simulated each with its own, every cell is the
    median over them on both sides, so a record of its own simulations compares exactly; two records of
    the same bench pool their repetitions, and a record of another bench is refused."""
    models = ("vgg19", "resnet50:allreduce")
    waits = [{"wake_wait_s": (w, w / 2), "step_wait_s": (w, w),
              "record": [{"wake_wait_s": w, "wake_wait_all_s": w}, {"wake_wait_s": w / 2, "wake_wait_all_s": w}]}
             for w in (1e-4, 2e-3, 6e-3)]
    record = tenants_record(RECORDED, models, policies=("fabric",), waits=waits)
    rows = compare_record(record, cpu_wait=True)
    assert all(r.get("iteration_error", 0) == pytest.approx(0, abs=1e-9) for r in rows)
    assert {r["repetitions"] for r in rows} == {3}
    # without the waits every repetition simulates alike: the cells compare the wait-free model with the median
    free = compare_record(record)
    assert free[0]["sim_iteration_s"] < free[0]["emu_iteration_s"]
    # pooled: six repetitions whose medians are those of the union
    slower = tenants_record(replace(RECORDED, compute_s=(0.3, 0.1)), models, policies=("fabric",))
    slower["compute_s"] = [[0.3, 0.3], [0.1, 0.1]]
    pooled = compare_record([record, slower], cpu_wait=False)
    vgg = sorted([r["jobs"][0]["median_iteration_s"] for r in record["rows"] + slower["rows"]])
    assert pooled[0]["repetitions"] == 4 and pooled[0]["emu_iteration_s"] == pytest.approx((vgg[1] + vgg[2]) / 2)
    other = tenants_record(RECORDED, models, policies=("fabric",))
    other["settings"]["rate"] = "100mbit"
    with pytest.raises(ConfigError, match="different benches"):
        compare_record([record, other])
