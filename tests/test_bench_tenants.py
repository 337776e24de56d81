"""geryon bench tenants: utilisation arithmetic, settings checks, and a tiny run of a replayed ring allreduce
job, a replayed PS job and a background flow on one emulated fabric (every update applied exactly once,
checked by the jobs' drains)."""

import pytest

from geryon.bench.tenants import (TenantSettings, job_kind, job_names, run_tenants_bench, summarize,
                                  utilisation, wake_wait)
from geryon.errors import ConfigError


def test_utilisation_is_compute_over_wall_summed_over_workers():
    steps = [[{"seconds": 0.5}, {"seconds": 0.5}], [{"seconds": 1.0}, {"seconds": 1.0}]]
    assert utilisation([0.25, 0.5], steps) == {"compute_s": 1.5, "wall_s": 3.0, "utilisation": 0.5}


def test_a_wake_ups_cpu_wait_is_the_wait_over_the_times_scheduled_in_pooled_over_steps():
    steps = [[{"run_wait_s": 0.010, "run_schedulings": 40, "run_wait_all_s": 0.030, "run_schedulings_all": 100}],
             [{"run_wait_s": 0.002, "run_schedulings": 10, "run_wait_all_s": 0.010, "run_schedulings_all": 100},
              {"run_wait_s": 0.5}]]   # a step without counts (no schedstat) adds nothing
    assert wake_wait(steps) == pytest.approx(0.012 / 50)
    assert wake_wait(steps, "_all") == pytest.approx(0.040 / 200)
    assert wake_wait([[{"run_wait_s": 0.5}]]) is None


def test_summary_takes_the_median_over_repetitions():
    rows = [{"policy": "fabric", "aggregate_utilisation": u, "background_share": b,
             "jobs": [{"job": "a", "median_iteration_s": u, "utilisation": u}]}
            for u, b in ((0.2, 0.1), (0.4, 0.3), (0.3, 0.2))]
    assert summarize(rows) == {"fabric": {"aggregate_utilisation": 0.3, "background_share": 0.2,
                                          "jobs": {"a": {"median_iteration_s": 0.3, "utilisation": 0.3}}}}


@pytest.mark.parametrize("fields, message", [({"models": ("a",) * 4}, "1 to 3 models"),
                                             ({"policies": ("fabric", "crux")}, "unknown policies crux"),
                                             ({"models": ("vgg19:ring",)}, "MODEL:allreduce"),
                                             ({"models": ("resnet50:allreduce",), "workers": 1},
                                              "at least 2 workers")])
def test_settings_say_what_is_wrong(fields, message):
    with pytest.raises(ConfigError, match=message):
        TenantSettings(**fields)


def test_jobs_are_ps_unless_marked_allreduce_and_hosts_follow():
    assert job_kind("vgg19") == ("vgg19", "ps") and job_kind("resnet50:allreduce") == ("resnet50", "allreduce")
    assert job_names(("vgg19", "resnet50:allreduce")) == ["vgg19-ps-0", "resnet50-allreduce-1"]
    # workers shared by every job, PS servers on hosts of their own, one background sender
    assert TenantSettings(models=("vgg19", "resnet50:allreduce"), workers=2).hosts == 5
    assert TenantSettings(models=("resnet50:allreduce",), workers=3).hosts == 4


@pytest.mark.root
@pytest.mark.slow  # ~45 s on 2 loaded cores: six role processes import torch
def test_allreduce_and_ps_jobs_and_background_share_one_fabric():
    record = run_tenants_bench(TenantSettings(models=("resnet50:allreduce", "resnet50"), workers=2,
                                              iterations=2, warmup=0, rate="50mbit",
                                              policies=("vanilla", "fabric")))
    vanilla, fabric = record["rows"]
    assert [j["job"] for j in fabric["jobs"]] == ["resnet50-allreduce-0", "resnet50-ps-1"]
    assert [j["classes"] for j in vanilla["jobs"]] == ["unmarked", "unmarked"]
    assert [j["classes"] for j in fabric["jobs"]] == ["high:46,low:0", "high:46,low:0"]  # equal weights
    for row in record["rows"]:
        compute = sum(j["compute_s"] for j in row["jobs"])
        wall = sum(j["wall_s"] for j in row["jobs"])
        assert row["aggregate_utilisation"] == pytest.approx(compute / wall)
        assert all(0 < j["utilisation"] < 1 and j["median_iteration_s"] > 0 for j in row["jobs"])
        assert 0 < row["background_share"] < 1  # the background flow moved bytes through the shared port
        for job in row["jobs"]:   # the replay thread sleeps once per layer at least (107 in ResNet-50)
            assert job["wakeups"] >= 107
            assert job["wake_wait_s"] * job["wakeups"] == pytest.approx(job["cpu_wait_s"])
            assert job["wake_wait_all_s"] >= 0
    assert fabric["background_floor"] == 0.1 and vanilla["background_floor"] is None
    assert record["weights"][0] == pytest.approx(record["weights"][1])  # the same model: the same intensity
    # every segment's drain checked that each ring rank applied every iteration's average exactly once
