"""Allreduce mode with --overlap next-forward (geryon.runtime.ddp_overlap): each parameter is updated as
its bucket's reduction lands, and training ends with exactly the parameters of the barrier version
(DDP with geryon's comm hook), whatever the optimizer's groups, schedule, clipping and checkpoints."""

import pytest
import torch

from geryon.errors import ConfigError
from geryon.launch.config import parse_launch_args
from geryon.runtime.ddp_overlap import plan_buckets
from geryon.runtime.env import RankEnv
from launch_support import REPO, launcher_exit_abort, run_launcher

SCRIPT = REPO / "tests" / "ps_optimizer_script.py"
RESNET = REPO / "examples" / "train_resnet.py"
# tiny: BatchNorm, AdamW with two groups, warm-up then cosine, clipping by the global norm
RESNET_ARGS = ["--steps", "6", "--width", "4", "--train-size", "128", "--test-size", "20", "--warmup", "2",
               "--batch-size", "8", "--clip", "0.5"]
ALLREDUCE = ["--local", "--mode", "allreduce", "--workers", "2"]


def _train(out, script, *args, overlap: str) -> dict:
    result = run_launcher(*ALLREDUCE, "--overlap", overlap, script, *args, "--out", out, timeout=240)
    if not launcher_exit_abort(result):   # PyTorch's exit-time abort after worker 0 saved: the file counts
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return torch.load(out, weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("script, args", [
    (SCRIPT, ["--case", "checkpoint"]),
    (RESNET, RESNET_ARGS),
], ids=["adam-amsgrad-checkpoint-reload", "resnet-example"])
def test_overlap_is_bit_equal_to_the_barrier(tmp_path, script, args):
    """The same updates from the same averaged gradients, only as each bucket lands: Adam's state
    saved, trained on, reloaded (optimizer.state_dict() is torch's own); the ResNet example's groups,
    schedule, clipping and BatchNorm buffers."""
    barrier = _train(tmp_path / "barrier.pt", script, *args, overlap="barrier")
    overlapped = _train(tmp_path / "overlap.pt", script, *args, overlap="next-forward")
    assert overlapped.keys() == barrier.keys()
    for key in barrier:
        assert torch.equal(overlapped[key], barrier[key]), key
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in barrier.values())


@pytest.mark.slow
@pytest.mark.parametrize("script, args, message", [
    (SCRIPT, ["--case", "lamb"], "needs an elementwise torch.optim class"),
    (RESNET, [*RESNET_ARGS, "--grad-accum", "2"], "model.no_sync() (gradient accumulation) is not supported"),
], ids=["lamb-needs-whole-tensors", "no-sync-accumulation"])
def test_what_cannot_run_per_bucket_is_refused(tmp_path, script, args, message):
    """LAMB scales each tensor's update by its norm, and accumulation keeps gradients local over several
    backward passes: neither can be updated as each reduction lands; both say to use the barrier."""
    result = run_launcher(*ALLREDUCE, "--overlap", "next-forward", script, *args, "--out", tmp_path / "x.pt",
                          timeout=240)
    assert result.returncode != 0
    assert message in result.stderr and "--overlap barrier" in result.stderr


def test_buckets_follow_backward_order_and_never_mix_classes():
    params = [torch.zeros(n) for n in (4, 4, 4, 4, 4)]
    priorities = [(0, 0), (0, 1), (1, 2), (1, 3), (1, 4)]
    # 16 bytes a tensor, 32 a bucket: cut by size, and at the class change between tensors 2 and 1
    assert plan_buckets(params, priorities, cap_bytes=32) == [[4, 3], [2], [1, 0]]
    assert plan_buckets(params, priorities, cap_bytes=1e9) == [[4, 3, 2], [1, 0]]
    assert plan_buckets([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], [(0, 0), (0, 1)], 1e9) == [[1], [0]]


def test_the_flag_and_its_twin():
    script = str(REPO / "examples" / "train_cnn.py")
    assert parse_launch_args(["--local", script]).overlap == "barrier"
    assert parse_launch_args(["--local", "--overlap", "next-forward", script]).overlap == "next-forward"
    assert parse_launch_args(["--local", script], environ={"GERYON_OVERLAP": "next-forward"}).overlap == \
        "next-forward"
    with pytest.raises(ConfigError, match="--mode allreduce only"):
        parse_launch_args(["--local", "--mode", "ps", "--overlap", "next-forward", script])
    with pytest.raises(ConfigError, match="--overlap"):
        parse_launch_args(["--local", "--overlap", "ahead", script])
    with pytest.raises(ConfigError, match="GERYON_OVERLAP"):
        RankEnv.from_environ({"GERYON_OVERLAP": "sometimes"})


def test_plain_ddp_leaves_the_script_to_gloo():
    """--plain-ddp (the demo's baseline): the ranks see no transport to use, so distribute() gives the
    script's own DDP over gloo, as under torchrun; it means nothing outside allreduce's barrier."""
    from geryon.launch.environment import job_environment
    from geryon.launch.placement import RankSpec

    script = str(REPO / "examples" / "train_cnn.py")
    config = parse_launch_args(["--local", "--plain-ddp", script])
    assert config.plain_ddp and not parse_launch_args(["--local", script]).plain_ddp
    assert parse_launch_args(["--local", script], environ={"GERYON_PLAIN_DDP": "1"}).plain_ddp
    env = job_environment(config, RankSpec("worker", 0, 0, 0), "127.0.0.1", 1, 1)
    rank = RankEnv.from_environ({**env, "RANK": "0", "WORLD_SIZE": "2"})
    assert rank.secret and not rank.has_transport
    assert RankEnv.from_environ({**env, "GERYON_PLAIN_DDP": "", "RANK": "0", "WORLD_SIZE": "2"}).has_transport
    for flags in (["--mode", "ps"], ["--overlap", "next-forward"]):
        with pytest.raises(ConfigError, match="--plain-ddp"):
            parse_launch_args(["--local", "--plain-ddp", *flags, script])
