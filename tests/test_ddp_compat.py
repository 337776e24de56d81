"""DDP's options and features under geryon, one test per cell of docs/ddp-compat.md.

Real jobs (`python -m geryon.launch --local`, 2 workers) run tests/ddp_probe.py with one feature each
and must end with the parameters `ddp_probe.reference()` computes in one process; refusals are
checked in-process, with their messages.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import geryon
from geryon.runtime.env import RankEnv
from geryon.errors import ConfigError
from geryon.runtime.ddp_options import check_ddp_options, ddp_defaults, wrap_ddp
from launch_support import REPO, clean_env, run_launcher

sys.path.insert(0, str(Path(__file__).parent))
import ddp_probe  # noqa: E402

PROBE = REPO / "tests" / "ddp_probe.py"
SINGLE_PS = RankEnv(mode="ps", servers=1)
SINGLE = RankEnv()


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo process group of one rank, so that DistributedDataParallel can be built in this process."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- options: passed through, refused where they mean nothing --------------------------------------

def test_ddps_own_options_are_known():
    assert {"find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb",
            "broadcast_buffers", "init_sync", "mixed_precision"} <= set(ddp_defaults())


def test_an_unknown_option_is_a_typo():
    with pytest.raises(ConfigError, match="find_unused_params is not an option of torch's DistributedDataParallel"):
        geryon.distribute(nn.Linear(2, 2), None, job=SINGLE, find_unused_params=True)


def test_options_reach_ddp(world_of_one):
    ddp = wrap_ddp(nn.Linear(2, 2), {"find_unused_parameters": True, "static_graph": True,
                                     "gradient_as_bucket_view": True, "bucket_cap_mb": 1,
                                     "broadcast_buffers": False})
    assert ddp.find_unused_parameters and ddp.static_graph and ddp.gradient_as_bucket_view
    assert ddp.bucket_bytes_cap == 1024 * 1024 and not ddp.broadcast_buffers


def test_a_wrapped_model_is_kept_and_its_options_belong_to_its_constructor(world_of_one):
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(nn.Linear(2, 2))
    assert wrap_ddp(ddp, {}) is ddp
    with pytest.raises(ConfigError, match="already a DistributedDataParallel, so static_graph belong"):
        wrap_ddp(ddp, {"static_graph": True})
    with pytest.raises(ConfigError, match="give geryon.distribute.. the bare model"):
        geryon.distribute(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), job=SINGLE_PS)


@pytest.mark.parametrize("name, value, reason", [
    ("find_unused_parameters", True, "pushes a zero gradient"),
    ("static_graph", True, "no DDP reducer"),
    ("gradient_as_bucket_view", True, "no DDP buckets"),
    ("bucket_cap_mb", 1, "no DDP buckets"),
    ("broadcast_buffers", False, "no DDP forward pass"),
    ("init_sync", False, "worker 0's parameters"),
])
def test_ps_mode_refuses_ddp_options_before_training(name, value, reason):
    model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=rf"{name}={value!r}\): a DistributedDataParallel option, which has "
                                          rf"no meaning in --mode ps \([^)]*{reason}"):
        geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job=SINGLE_PS, **{name: value})


def test_ps_mode_accepts_ddps_defaults():
    model = nn.Linear(2, 2)
    geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job=SINGLE_PS,
                      find_unused_parameters=False, broadcast_buffers=True, static_graph=False)


def test_subgroups_are_refused_under_geryons_transport():
    with pytest.raises(ConfigError, match="a subgroup is not supported"):
        check_ddp_options({"process_group": object()}, "allreduce", transport=True)
    check_ddp_options({"process_group": object()}, "allreduce", transport=False)  # plain torchrun: DDP's


# -- refusals with their messages ----------------------------------------------------------------------

@pytest.mark.parametrize("job", [SINGLE, SINGLE_PS], ids=["allreduce", "ps"])
def test_sync_batchnorm_on_cpu_is_refused_before_training(job):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    with pytest.raises(ConfigError, match="1 is a SyncBatchNorm on CPU: PyTorch's SyncBatchNorm only runs on "
                                          "GPU/XPU tensors"):
        geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job=job)


def test_torch_itself_refuses_sync_batchnorm_on_cpu():
    """Why the refusal above: the same model fails in PyTorch's own forward."""
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    with pytest.raises(ValueError, match="SyncBatchNorm expected input tensor to be on GPU"):
        model(torch.zeros(2, 4))


@pytest.mark.parametrize("method, message", [
    ("no_sync", r"model.no_sync\(\) \(gradient accumulation\) is not supported in --mode ps"),
    ("join", r"model.join\(\) \(uneven inputs\) is not supported in --mode ps"),
])
def test_ps_mode_refuses_no_sync_and_join(method, message):
    model = nn.Linear(2, 2)
    model, _optimizer = geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job=SINGLE_PS)
    with pytest.raises(ConfigError, match=message):
        getattr(model, method)()


# -- real jobs: every feature ends with the single-process parameters ---------------------------------

def run_probe(tmp_path, feature: str, mode: str, env=None, timeout: float = 240) -> dict:
    out = tmp_path / f"{feature}-{mode}.json"
    mode_args = ["--mode", "ps", "--servers", "1"] if mode == "ps" else ["--mode", "allreduce"]
    result = run_launcher("--local", "--workers", "2", *mode_args, PROBE, "--feature", feature,
                          "--out", out, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert (record["workers"], record["mode"]) == (2, mode)
    return record


ALLREDUCE_FEATURES = ["no_sync", "unused", "static_graph", "autocast", "compile", "join", "wrapped",
                      "bucket_options"]
PS_FEATURES = ["unused", "autocast", "compile"]


@pytest.mark.slow
@pytest.mark.parametrize("mode, feature", [("allreduce", f) for f in ALLREDUCE_FEATURES]
                         + [("ps", f) for f in PS_FEATURES])
def test_feature_gives_the_single_process_parameters(tmp_path, mode, feature):
    record = run_probe(tmp_path, feature, mode)
    assert record["params"] == pytest.approx(ddp_probe.reference(feature), rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GERYON_TEST_INDUCTOR"),
                    reason="inductor compiles C++ for ~35 s per process here; GERYON_TEST_INDUCTOR=1 runs it")
@pytest.mark.parametrize("mode", ["allreduce", "ps"])
def test_compile_with_inductor_gives_the_single_process_parameters(tmp_path, mode):
    record = run_probe(tmp_path, "compile", mode, env=clean_env(PROBE_COMPILE_BACKEND="inductor"), timeout=600)
    assert record["params"] == pytest.approx(ddp_probe.reference("compile"), rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("feature", ["hook_classes_unused", "hook_classes_static"])
def test_geryons_hook_carries_each_buckets_class_with_ddp_options(tmp_path, feature):
    """Tiny buckets: each bucket goes with its most urgent member's (class, urgency) under --priority coarse."""
    record = run_probe(tmp_path, feature, "allreduce")
    assert record["params"] == pytest.approx(ddp_probe.reference(feature), rel=1e-4, abs=1e-5)
    order = ["conv.weight", "conv.bias", "fc.weight", "fc.bias", "aux.weight", "aux.bias"]
    calls = record["hook_calls"]
    assert calls and {c["priority"][0] for c in calls} == {0, 1}  # both classes travelled
    for call in calls:
        expected = [min(0 if n.startswith("conv") else 1 for n in call["params"]),
                    min(order.index(n) for n in call["params"])]
        assert call["priority"] == expected, call


@pytest.mark.slow
def test_a_ddp_with_its_own_comm_hook_is_refused_under_geryon(tmp_path):
    script = tmp_path / "hooked.py"
    script.write_text(
        "import torch, geryon\n"
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "geryon.init()\n"
        "model = DistributedDataParallel(torch.nn.Linear(4, 2))\n"
        "model.register_comm_hook(None, default_hooks.allreduce_hook)\n"
        "geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1))\n")
    result = run_launcher("--local", "--workers", "2", script, timeout=120)
    assert result.returncode != 0
    assert "this DistributedDataParallel already has a communication hook" in result.stderr
