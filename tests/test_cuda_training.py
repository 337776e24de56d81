"""CUDA jobs end where one CUDA process does: examples/train_resnet.py (AdamW, schedule, clipping)
and the demo's CNN, 2 and 4 ranks sharing one GPU (geryon's flows are TCP, so `geryon.launch
--local` runs them) in allreduce mode; --mode ps refuses CUDA parameters before training. Skipped
where no GPU is visible; scripts/gpu-check.sh runs them on a GPU machine."""

import pytest
import torch

from launch_support import EXAMPLE, EXAMPLE_ARGS, PYTHON, REPO, json_records, loss_curve, rank_lines, \
    run_launcher, run_stoppable

pytestmark = pytest.mark.cuda

RESNET = REPO / "examples" / "train_resnet.py"
RESNET_ARGS = ["--steps", "8", "--width", "4", "--train-size", "256", "--test-size", "50", "--warmup", "2",
               "--batch-size", "8", "--clip", "0.5", "--log-json", "--device", "cuda"]
CNN_ARGS = [*EXAMPLE_ARGS, "--device", "cuda"]


def parameters(path) -> list[float]:
    state = torch.load(path, weights_only=True, map_location="cpu")
    return torch.cat([t.double().reshape(-1) for name, t in state.items()
                      if not name.endswith(("running_mean", "running_var", "num_batches_tracked"))]).tolist()


@pytest.fixture(scope="module")
def resnet_single(tmp_path_factory):
    """One CUDA process per world size, on the same micro-batches as W ranks (--grad-accum W)."""
    folder = tmp_path_factory.mktemp("cuda-single")
    finals = {}
    for world in (2, 4):
        out = folder / f"single-{world}.pt"
        result = run_stoppable([PYTHON, str(RESNET), *RESNET_ARGS, "--grad-accum", str(world), "--out", str(out)],
                               240)
        assert result.returncode == 0, result.stderr[-3000:]
        finals[world] = out
    return finals


@pytest.fixture(scope="module")
def cnn_single():
    result = run_stoppable([PYTHON, str(EXAMPLE), *CNN_ARGS], 240)
    assert result.returncode == 0, result.stderr[-3000:]
    return loss_curve(json_records(result.stdout.splitlines()))


def _launch(world: int, script, args, tmp_path=None):
    out = ["--out", tmp_path / "final.pt"] if tmp_path is not None else []
    result = run_launcher("--local", "--nproc-per-node", str(world), "--mode", "allreduce", script, *args, *out,
                          timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("world", [2, 4])
def test_resnet_on_cuda_ranks_ends_with_the_single_cuda_process_parameters(world, resnet_single, tmp_path):
    _launch(world, RESNET, [*RESNET_ARGS, "--checkpoint-dir", tmp_path, "--checkpoint-every", "4"], tmp_path)
    assert torch.load(tmp_path / "step-4.pt", weights_only=True, map_location="cpu")["step"] == 4
    assert parameters(tmp_path / "final.pt") == pytest.approx(parameters(resnet_single[world]), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("world", [2, 4])
def test_the_demo_cnn_on_cuda_ranks_follows_the_single_cuda_process_curve(world, cnn_single):
    result = _launch(world, EXAMPLE, CNN_ARGS)
    curve = loss_curve(json_records(rank_lines(result.stdout, "worker0")))
    assert curve == pytest.approx(cnn_single, rel=1e-4, abs=1e-5)


def test_ps_mode_refuses_cuda_parameters_before_training():
    import geryon
    from geryon.errors import ConfigError
    from geryon.runtime.env import RankEnv

    model = torch.nn.Linear(2, 2).cuda()
    with pytest.raises(ConfigError, match="--mode ps trains CPU parameters only: weight is on cuda"):
        geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          job=RankEnv.from_environ({"GERYON_MODE": "ps"}))
