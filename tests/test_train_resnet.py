"""examples/train_resnet.py (BatchNorm, AdamW with two groups, warm-up + cosine, clipping, checkpoints):
the same parameters alone, under geryon's allreduce and under plain torchrun, and a resumed run
ends where an uninterrupted one does."""

import importlib.util

import pytest
import torch

from launch_support import PYTHON, REPO, json_records, rank_lines, run_launcher, run_launcher_killing, \
    run_plain_torchrun, run_stoppable

SCRIPT = REPO / "examples" / "train_resnet.py"
# Tiny and quick; clip 0.5 is below the gradient norm of these steps, so clipping acts.
ARGS = ["--steps", "8", "--width", "4", "--train-size", "256", "--test-size", "50", "--warmup", "2",
        "--batch-size", "8", "--clip", "0.5", "--log-json"]
WORKERS = 2


def example():
    spec = importlib.util.spec_from_file_location("train_resnet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameters(path) -> list[float]:
    """The trained parameters (not BatchNorm's running statistics) of a saved final state."""
    model = example().ResNet(4)
    model.load_state_dict(torch.load(path, weights_only=True))
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def everything(path) -> list[float]:
    """Parameters and buffers, for runs that must agree on all of it."""
    state = torch.load(path, weights_only=True)
    return torch.cat([t.detach().double().reshape(-1) for t in state.values()]).tolist()


def run_single(tmp_path, name, *extra) -> list[dict]:
    result = run_stoppable([PYTHON, str(SCRIPT), *ARGS, "--out", str(tmp_path / f"{name}.pt"), *extra], 180)
    assert result.returncode == 0, result.stderr[-3000:]
    return json_records(result.stdout.splitlines())


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process on the same step batches: W micro-batches of --batch-size (BatchNorm's groups)."""
    folder = tmp_path_factory.mktemp("single")
    records = run_single(folder, "final", "--grad-accum", str(WORKERS))
    assert records[-1]["step_batch"] == 16 and records[-1]["workers"] == 1
    return folder / "final.pt"


@pytest.fixture(scope="module")
def allreduce(tmp_path_factory):
    """Two workers under geryon (allreduce), checkpointing every 4 steps."""
    folder = tmp_path_factory.mktemp("allreduce")
    result = run_launcher("--local", "--nproc-per-node", str(WORKERS), "--mode", "allreduce", SCRIPT, *ARGS,
                          "--out", folder / "final.pt", "--checkpoint-dir", folder, "--checkpoint-every", "4",
                          timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json_records(rank_lines(result.stdout, "worker0"))[-1]
    assert (final["workers"], final["step_batch"]) == (WORKERS, 16)
    return folder


def test_schedule_warms_up_then_follows_a_cosine():
    factor = example().warmup_cosine(warmup=2, total=10)
    assert [factor(s) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert factor(6) == pytest.approx(0.5) and factor(10) == pytest.approx(0.0)


def test_two_parameter_groups_leave_biases_and_norms_undecayed():
    module = example()
    groups = module.parameter_groups(module.ResNet(4), weight_decay=0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert all(p.ndim > 1 for p in groups[0]["params"]) and all(p.ndim == 1 for p in groups[1]["params"])


def test_a_step_trains_on_the_same_images_after_a_resume():
    module = example()
    first = [module.step_indices(s, 256, 16, seed=0) for s in range(20)]
    assert torch.equal(first[17], module.step_indices(17, 256, 16, seed=0))
    assert torch.equal(torch.cat(first[:16]).sort().values, torch.arange(256))


@pytest.mark.slow
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run_single_process(tmp_path):
    records = run_single(tmp_path, "whole", "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "4")
    assert records[-1]["resumed_from"] == 0 and (tmp_path / "step-4.pt").exists()
    resumed = run_single(tmp_path, "resumed", "--resume", str(tmp_path / "step-4.pt"))
    assert resumed[-1]["resumed_from"] == 4 and len(resumed) == 4 + 1
    assert everything(tmp_path / "resumed.pt") == pytest.approx(everything(tmp_path / "whole.pt"), rel=1e-6,
                                                                abs=1e-7)


@pytest.mark.slow
def test_allreduce_gives_the_single_process_parameters(allreduce, single):
    assert parameters(allreduce / "final.pt") == pytest.approx(parameters(single), rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_allreduce_resumes_from_its_checkpoint_to_the_same_state(allreduce, tmp_path):
    result = run_launcher("--local", "--nproc-per-node", str(WORKERS), "--mode", "allreduce", SCRIPT, *ARGS,
                          "--out", tmp_path / "resumed.pt", "--resume", allreduce / "step-4.pt", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json_records(rank_lines(result.stdout, "worker0"))[-1]["resumed_from"] == 4
    assert everything(tmp_path / "resumed.pt") == pytest.approx(everything(allreduce / "final.pt"),
                                                                rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_plain_torchrun_gives_the_same_state_as_geryon(allreduce, single, tmp_path):
    """DDP over gloo, no geryon launcher: the same parameters, and the same BatchNorm statistics as geryon."""
    result, exit_abort = run_plain_torchrun(SCRIPT, [*ARGS, "--out", tmp_path / "final.pt"], WORKERS, 240)
    assert parameters(tmp_path / "final.pt") == pytest.approx(parameters(single), rel=1e-4, abs=1e-5)
    assert everything(tmp_path / "final.pt") == pytest.approx(everything(allreduce / "final.pt"), rel=1e-4,
                                                              abs=1e-5)
    if exit_abort:
        pytest.xfail(exit_abort)
    assert json_records(result.stdout.splitlines())[-1]["workers"] == WORKERS


@pytest.mark.slow
def test_ps_gives_the_single_process_parameters_and_resumes(single, tmp_path):
    """AdamW (two groups) on the servers, the schedule reaching them, clipping of the averaged gradient
    (geryon.clip_grad_norm_), and optimizer state gathered into / restored from a checkpoint."""
    ps = ["--local", "--nproc-per-node", str(WORKERS), "--mode", "ps", "--servers", "2", SCRIPT, *ARGS]
    result = run_launcher(*ps, "--out", tmp_path / "final.pt", "--checkpoint-dir", tmp_path,
                          "--checkpoint-every", "4", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert parameters(tmp_path / "final.pt") == pytest.approx(parameters(single), rel=1e-4, abs=1e-5)
    resumed = run_launcher(*ps, "--out", tmp_path / "resumed.pt", "--resume", tmp_path / "step-4.pt", timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert everything(tmp_path / "resumed.pt") == pytest.approx(everything(tmp_path / "final.pt"), rel=1e-4,
                                                                abs=1e-5)


@pytest.mark.slow
def test_allreduce_killed_worker_restarts_from_the_scripts_checkpoint(allreduce, tmp_path):
    """--max-restarts with the script's own checkpoints (--resume latest): a worker SIGKILLed in the middle
    of training, the job restarted, the same final state as the uninterrupted run."""
    result = run_launcher_killing(
        "--local", "--nproc-per-node", str(WORKERS), "--grace", "1", "--max-restarts", "1", SCRIPT, *ARGS,
        "--out", tmp_path / "final.pt", "--checkpoint-dir", tmp_path, "--checkpoint-every", "2",
        "--resume", "latest", victim="worker1", when='[worker0] {"step": 4,')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "worker1 was killed by SIGKILL; restarting the job" in result.stderr
    assert json_records(rank_lines(result.stdout, "worker0"))[-1]["resumed_from"] >= 4
    assert everything(tmp_path / "final.pt") == pytest.approx(everything(allreduce / "final.pt"), rel=1e-4,
                                                              abs=1e-5)


@pytest.mark.slow
def test_ps_killed_server_restarts_from_the_servers_checkpoint(allreduce, single, tmp_path):
    """--max-restarts with --ps-checkpoint-every: a server SIGKILLed in the middle of training, the job
    restarted from the servers' checkpoint (AdamW state, schedule, clipping, BatchNorm statistics), the
    same final state as the uninterrupted run, without the script's own checkpoint."""
    result = run_launcher_killing(
        "--local", "--nproc-per-node", str(WORKERS), "--mode", "ps", "--grace", "1", "--max-restarts", "1",
        "--ps-checkpoint-every", "2", "--ps-checkpoint-dir", tmp_path / "ps", SCRIPT, *ARGS,
        "--out", tmp_path / "final.pt", victim="server0", when='[worker0] {"step": 4,')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "server0 was killed by SIGKILL; restarting the job" in result.stderr
    assert json_records(rank_lines(result.stdout, "worker0"))[-1]["resumed_from"] >= 4
    assert parameters(tmp_path / "final.pt") == pytest.approx(parameters(single), rel=1e-4, abs=1e-5)
    assert everything(tmp_path / "final.pt") == pytest.approx(everything(allreduce / "final.pt"), rel=1e-4,
                                                              abs=1e-5)
