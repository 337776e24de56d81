"""`geryon bench paper` arithmetic: scaling, calibration, rows, rotation, policies, the report."""

import pytest
import torch

from geryon.bench.paper import PaperSettings, parse_params, policy_transport
from geryon.bench.paper_cli import settings_from_args
from geryon.bench.paper_math import (CONTROL, PaperScale, calibration_step, make_row, rotated, scaling_efficiency,
                                     slowest_per_iteration, summarize)
from geryon.bench.paper_report import markdown_report, plot_paper
from geryon.sim.paper import paper_efficiency
from geryon.cli import build_parser
from geryon.errors import ConfigError
from geryon.transport.policy import get_policy
from geryon.transport.shards import param_specs, plan_shards


def test_scale_keeps_the_transfer_to_compute_ratio():
    scale = PaperScale(compute_scale=11.0, size_scale=0.01, wall_scale=1.0)
    assert scale.link_rate(10e9) == 100_000_000 and scale.link_rate(40e9) == 400_000_000
    assert scale.replay_time_scale == 11.0
    slower = PaperScale(compute_scale=11.0, size_scale=0.01, wall_scale=2.0)
    assert slower.link_rate(10e9) == 50_000_000 and slower.replay_time_scale == 22.0
    # a 4 MB slice at 10 Gbit/s takes 3.2 ms; 40 KB at 100 Mbit/s too
    assert scale.slice_bytes(1024 * 1024) == 41943
    assert 41943 * 8 / scale.link_rate(10e9) == pytest.approx(4 * 1024 * 1024 * 8 / 10e9, rel=1e-4)
    assert scale.slice_bytes(10) == 1024
    with pytest.raises(ConfigError):
        PaperScale(compute_scale=0)


def test_calibration_step_reaches_the_target_when_communication_is_fixed():
    # iteration = compute + 4 s of exposed transfer: efficiency 26.9% needs compute = 0.269*4/0.731
    profile_s = 0.1475
    k = 5.0
    for _ in range(3):
        compute = k * profile_s
        k = calibration_step(k, compute, compute + 4.0, 0.269)
    compute = k * profile_s
    assert scaling_efficiency(compute, compute + 4.0) == pytest.approx(0.269, abs=1e-9)
    assert compute == pytest.approx(0.269 * 4.0 / 0.731)
    # compute-bound already: halve the scale rather than divide by zero
    assert calibration_step(10.0, 1.0, 0.99, 0.5) == 5.0
    with pytest.raises(ConfigError):
        calibration_step(1.0, 1.0, 2.0, 1.0)


def test_summary_and_slowest_worker():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert stats["median"] == 3.0 and stats["spread"] == 2.0 and stats["max"] == 100.0
    assert summarize([2.0, 4.0])["spread"] == 2.0
    assert slowest_per_iteration([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    with pytest.raises(ConfigError):
        summarize([])


def test_rotation_puts_every_policy_first_once():
    policies = ["vanilla", "slicing", "endhost", "geryon"]
    firsts = [rotated(policies, rep)[0] for rep in range(4)]
    assert sorted(firsts) == sorted(policies)
    assert rotated(policies, 1) == ["slicing", "endhost", "geryon", "vanilla"]
    assert rotated([], 3) == []


def test_row_has_the_fields_and_the_paper_figure():
    scale = PaperScale(11.0)
    row = make_row(model="vgg19", link="10gbe", policy="geryon", workers=8, layout="colocated",
                   congestion="bbr", times=[2.0, 2.0, 2.2], compute_s=1.8, batch=32, scale=scale,
                   vanilla_s=6.0)
    for key in ("model", "link", "policy", "workers", "layout", "iteration_s", "iteration_spread",
                "images_per_s", "speedup_vs_vanilla", "scaling_efficiency", "paper_scaling_efficiency",
                "time_scale", "size_scale", "bw_bits", "congestion"):
        assert key in row
    assert row["iteration_s"] == 2.0 and row["images_per_s"] == 128.0
    assert row["speedup_vs_vanilla"] == 3.0 and row["scaling_efficiency"] == 0.9
    assert row["paper_scaling_efficiency"] == 0.946
    assert row["error_points"] == pytest.approx(-4.6)
    assert row["bw_bits"] == 10e9 and row["link_rate_bits"] == 100_000_000
    assert paper_efficiency("vgg19", "10gbe", "endhost") is None
    assert paper_efficiency("vgg19", "40gbe", "slicing") == 0.853   # (model, link, policy), as the rows say
    assert paper_efficiency("alexnet", None, "geryon") is None
    control = make_row(model="vgg19", link="none", policy=CONTROL, workers=8, layout="colocated",
                       congestion="bbr", times=[1.0], compute_s=0.98, batch=32, scale=scale, vanilla_s=None)
    assert control["bw_bits"] is None and control["paper_scaling_efficiency"] is None


def test_policies_and_variants():
    defaults = {"slice_bytes": 40960, "priority": "coarse", "placement": "count"}
    assert policy_transport("geryon", defaults)["policy"] == "geryon"
    variant = policy_transport("geryon+bytes+fifo", defaults)
    assert variant["placement"] == "bytes" and variant["within_class"] == "fifo"
    assert variant["slice_bytes"] == 40960
    with pytest.raises(ConfigError):
        policy_transport("magic", defaults)
    with pytest.raises(ConfigError):
        policy_transport("geryon+magic", defaults)
    assert parse_params("1024K") == 1048576 and parse_params("1M") == 1048576 and parse_params("40000") == 40000
    with pytest.raises(ConfigError):
        parse_params("lots")


def test_command_line_settings():
    args = build_parser().parse_args(["bench", "paper", "--model", "all", "--link", "40gbe",
                                      "--congestion", "bbr,cubic", "--slice-params", "none",
                                      "--priority", "threshold=0.3", "--control-rate", "1gbit"])
    settings = settings_from_args(args)
    assert settings.models == ("vgg19", "resnet50", "alexnet", "inceptionv3")
    assert settings.links == ("40gbe",) and settings.congestions == ("bbr", "cubic")
    assert settings.slice_table == () and settings.priority == "threshold" and settings.threshold == 0.3
    assert settings.control_rate == 1_000_000_000
    default = settings_from_args(build_parser().parse_args(["bench", "paper"]))
    assert default.models == ("vgg19",) and default.links == ("10gbe", "40gbe") and default.workers == 8
    with pytest.raises(ConfigError):
        PaperSettings(links=("100gbe",))
    with pytest.raises(ConfigError):
        settings_from_args(build_parser().parse_args(["bench", "paper", "--model", "yolo"]))
    assert default.compute_rt == default.thread_rt + 1      # the replayed GPU above every transport thread
    off = settings_from_args(build_parser().parse_args(["bench", "paper", "--compute-rt", "0"]))
    assert off.compute_rt == 0
    with pytest.raises(ConfigError, match="compute_rt"):
        PaperSettings(compute_rt=100)
    assert default.ack_priority == "own"                    # the emulated cluster's default, every policy alike
    no_ack = settings_from_args(build_parser().parse_args(["bench", "paper", "--ack-priority", "off"]))
    assert no_ack.ack_priority == "off"
    with pytest.raises(ConfigError, match="ack priority"):
        PaperSettings(ack_priority="sometimes")


def test_the_replayed_compute_runs_real_time_only_inside_the_block():
    """`compute_priority(P)` makes the calling thread SCHED_RR at P for the block and normal after it;
    0 leaves the thread alone; the role's flag accepts 0..99 only."""
    import os

    from geryon.bench.replay_roles import build_parser as role_parser, compute_priority

    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        pytest.skip(f"real-time scheduling is refused here ({exc}): it needs CAP_SYS_NICE")
    with compute_priority(3):
        assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == (os.SCHED_RR, 3)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    with compute_priority(0):
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    args = ["worker", "--workers", "2", "--servers", "2", "--model", "alexnet"]
    assert role_parser().parse_args(args + ["--compute-rt", "3"]).compute_rt == 3
    with pytest.raises(SystemExit):
        role_parser().parse_args(args + ["--compute-rt", "100"])


def test_byte_balanced_placement_evens_out_servers():
    # ResNet-like: big conv tensors alternating with tiny BN tensors, one slice each
    tensors = [torch.zeros(n) for n in [1000, 10] * 8]
    specs = param_specs(tensors, [(0, i) for i in range(len(tensors))])
    policy = get_policy("geryon")

    def loads(placement):
        load = [0, 0]
        for shard in plan_shards(specs, 2, policy, 1 << 20, placement):
            load[shard.server] += shard.length
        return load

    assert loads("count") == [8000, 80]          # round-robin by count: every conv on server 0
    assert loads("bytes") == [4040, 4040]
    # the default is unchanged (P3's round-robin)
    assert plan_shards(specs, 2, policy, 1 << 20) == plan_shards(specs, 2, policy, 1 << 20, "count")


def test_markdown_and_chart(tmp_path):
    scale = PaperScale(11.0)
    common = dict(model="vgg19", link="10gbe", workers=8, layout="colocated", congestion="bbr",
                  compute_s=1.6, batch=32, scale=scale, vanilla_s=6.0)
    rows = [make_row(policy=p, times=[t], **common) for p, t in
            (("vanilla", 6.0), ("slicing", 2.1), ("endhost", 1.9), ("geryon", 1.7))]
    rows.append(make_row(model="vgg19", link="none", policy=CONTROL, workers=8, layout="colocated",
                         congestion="bbr", times=[1.62], compute_s=1.6, batch=32, scale=scale, vanilla_s=None,
                         extra={"control_of": "geryon", "link_rate_bits": 10**10, "cpu_roles_cores": 0.3,
                                "cpu_machine_cores": 16, "cpu_machine_share": 0.9}))
    slicing = [make_row(policy=p, times=[t], **common, extra={"slice_params": 1048576,
                                                              "paper_images_per_s": 279.2 if p == "geryon" else 272.0,
                                                              "paper_geryon_over_endhost": 279.2 / 272.0})
               for p, t in (("geryon", 1.7), ("endhost", 1.9))]
    record = {"rows": rows, "slicing_rows": slicing, "compute_scale": 11.0, "wall_s": 100.0,
              "calibration": {"cell": ["vgg19", "10gbe", "vanilla"], "target": 0.269, "compute_scale": 11.0,
                              "probes": [{}]}, "scaling_note": scale.describe(10e9)}
    text = markdown_report(record)
    assert "**11.000**" in text and "| vgg19 | 10gbe | bbr | geryon | 1.700" in text
    assert "94.6%" in text and "Control (vgg19" in text and "| 1024K | bbr |" in text
    assert "used 0.30 of the 16 cores, the machine was 90% busy" in text  # the record's machine, not this one
    plot_paper(record, tmp_path / "paper.png")
    assert (tmp_path / "paper.png").stat().st_size > 1000
