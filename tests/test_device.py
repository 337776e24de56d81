"""The rank's device (geryon.runtime.device): the CPU where no GPU is visible, the rank's GPU by
LOCAL_RANK where one is; the examples' --device and a parameter server's --server-device, and their
clear refusal of cuda without a GPU."""

import subprocess

import pytest
import torch

from geryon.errors import ConfigError
from geryon.runtime.device import rank_device, select_device
from geryon.runtime.env import RankEnv
from launch_support import EXAMPLE, PYTHON, REPO, clean_env, run_launcher

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
RESNET = REPO / "examples" / "train_resnet.py"


@NO_GPU
def test_without_a_gpu_every_rank_is_on_the_cpu():
    assert RankEnv.from_environ({}).device == torch.device("cpu")
    assert RankEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
                                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}).device == torch.device("cpu")
    assert select_device("auto", 1) == torch.device("cpu") and select_device("cpu", 1) == torch.device("cpu")


def test_init_gives_a_single_process_its_device():
    import geryon

    ctx = geryon.init()
    assert ctx.device == rank_device(0)
    if ctx.device.type == "cuda":
        assert torch.cuda.current_device() == ctx.device.index


@NO_GPU
def test_device_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(ConfigError, match="sees no CUDA GPU.*--device cpu"):
        select_device("cuda")
    with pytest.raises(ConfigError, match="--device 'tpu'"):
        select_device("tpu")


@NO_GPU
@pytest.mark.parametrize("script", [EXAMPLE, RESNET], ids=["train_cnn", "train_resnet"])
def test_an_example_with_device_cuda_and_no_gpu_exits_with_that_message(script):
    result = subprocess.run([PYTHON, str(script), "--device", "cuda"], capture_output=True, text=True,
                            timeout=120, env=clean_env(), cwd=REPO)
    assert result.returncode != 0
    assert "--device cuda: this process sees no CUDA GPU" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.cuda
def test_local_ranks_share_the_visible_gpus_in_turn():
    count = torch.cuda.device_count()
    assert [rank_device(r).index for r in range(2 * count)] == list(range(count)) * 2
    assert select_device("cuda", 1) == torch.device("cuda", 1 % count)


def test_ps_mode_refuses_parameters_neither_on_the_cpu_nor_a_gpu_before_training():
    """A model on another device (here the meta device, which any machine has) is refused in --mode
    ps by distribute(), naming the parameter and what works instead."""
    import geryon

    model = torch.nn.Linear(2, 2, device="meta")
    job = RankEnv.from_environ({"GERYON_MODE": "ps"})
    with pytest.raises(ConfigError, match="--mode ps trains parameters on the CPU or a CUDA GPU: "
                                          "weight is on meta.*--mode allreduce"):
        geryon.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), job=job)


def test_a_server_device_is_the_cpu_or_a_gpu_this_process_sees():
    from geryon.runtime.device import server_device

    assert server_device("cpu", 3) == torch.device("cpu")
    with pytest.raises(ConfigError, match="--server-device 'tpu': use one of cpu, cuda"):
        server_device("tpu")
    if torch.cuda.is_available():
        assert server_device("cuda", 0) == torch.device("cuda", 0)
    else:
        with pytest.raises(ConfigError, match="this server sees no CUDA GPU.*--server-device cpu"):
            server_device("cuda")


@NO_GPU
def test_a_ps_job_with_gpu_servers_on_a_machine_without_one_stops_before_training():
    """--server-device reaches every server (flag, environment twin, the server role), which stops at
    its start, saying what to do, and the launcher ends the job with it."""
    result = run_launcher("--local", "--mode", "ps", "--workers", "2", "--server-device", "cuda", str(EXAMPLE),
                          "--iterations", "2", "--width", "4", "--train-size", "64", "--test-size", "10",
                          "--global-batch-size", "8", timeout=120)
    assert result.returncode != 0
    assert "server0 failed" in result.stderr
    assert "server 0: error: --server-device cuda (GERYON_SERVER_DEVICE): this server sees no CUDA GPU" \
        in result.stderr
