"""CUDA jobs end where one CUDA process does: examples/train_resnet.py (AdamW, schedule, clipping)
and the demo's CNN, 2 and 4 ranks sharing one GPU (geryon's flows are TCP, so `geryon.launch
--local` runs them) in allreduce mode, and 2 CUDA workers with one parameter server in --mode ps
(the server on the CPU, or on the GPU with --server-device cuda). Skipped where no GPU is visible;
scripts/gpu-check.sh runs them on a GPU machine."""

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


def _launch_ps(script, args, *flags, tmp_path=None):
    out = ["--out", tmp_path / "final.pt"] if tmp_path is not None else []
    result = run_launcher("--local", "--nproc-per-node", "2", "--mode", "ps", "--servers", "1", *flags, script,
                          *args, *out, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_resnet_on_cuda_ps_workers_ends_with_the_single_cuda_process_parameters(resnet_single, tmp_path):
    """AdamW (two groups, warm-up + cosine) on a CPU server, clipping of the averaged gradient, the
    optimizer state gathered from the server into a checkpoint: the single CUDA process's parameters."""
    result = _launch_ps(RESNET, [*RESNET_ARGS, "--checkpoint-dir", tmp_path, "--checkpoint-every", "4"],
                        tmp_path=tmp_path)
    assert "running AdamW" in "".join(rank_lines(result.stdout, "server0"))
    checkpoint = torch.load(tmp_path / "step-4.pt", weights_only=True, map_location="cpu")
    assert checkpoint["step"] == 4 and checkpoint["optimizer"]["state"]
    assert parameters(tmp_path / "final.pt") == pytest.approx(parameters(resnet_single[2]), rel=1e-4, abs=1e-5)


def test_the_demo_cnn_on_cuda_ps_workers_and_a_gpu_server_follows_the_single_cuda_process_curve(cnn_single):
    """The server holds its shards on the GPU and steps there; the workers pull ahead (each layer's
    parameters come back while backward runs, the next forward waits on their copies' events)."""
    result = _launch_ps(EXAMPLE, CNN_ARGS, "--server-device", "cuda", "--ps-pull", "ahead")
    assert "running SGD on cuda" in "".join(rank_lines(result.stdout, "server0"))
    records = json_records(rank_lines(result.stdout, "worker0"))
    assert records[-1]["mode"] == "ps"
    assert loss_curve(records) == pytest.approx(cnn_single, rel=1e-4, abs=1e-5)
