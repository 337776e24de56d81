"""geryon.init() / geryon.distribute(): the job is read from geryon's, torchrun's or Slurm's variables."""


import pytest

from geryon.runtime.env import RankEnv, first_slurm_host
from geryon.errors import ConfigError
from launch_support import EXAMPLE, EXAMPLE_ARGS, PYTHON, REPO, clean_env, json_records, loss_curve, \
    run_single_process
from ports import free_port


def test_single_process_without_variables():
    context = RankEnv.from_environ({})
    assert context == RankEnv() and not context.distributed and context.is_main


def test_geryon_launch_variables():
    context = RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.199.0.1",
                            "MASTER_PORT": "29500", "GERYON_ROLE": "worker", "GERYON_MODE": "ps",
                            "GERYON_POLICY": "geryon", "GERYON_SERVERS": "2", "GERYON_JOB_SECRET": "s3cret",
                            "GERYON_CLASSES": "high:46,low:0", "GERYON_HOST_IP": "10.199.0.2"})
    assert (context.rank, context.world_size, context.mode, context.servers) == (1, 4, "ps", 2)
    assert (context.launcher, context.policy, context.host_ip) == ("geryon", "geryon", "10.199.0.2")
    assert "s3cret" not in repr(context)


def test_torchrun_variables():
    context = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"})
    assert (context.launcher, context.mode, context.world_size) == ("torchrun", "allreduce", 2)


def test_slurm_variables():
    context = RankEnv.from_environ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                            "SLURM_STEP_NODELIST": "node[07-10],gpu1", "SLURM_JOB_ID": "4242"})
    assert (context.launcher, context.rank, context.world_size, context.local_rank) == ("slurm", 3, 8, 1)
    assert (context.master_addr, context.master_port) == ("node07", 24242)


@pytest.mark.parametrize("nodelist, first", [("n1", "n1"), ("n[1-3]", "n1"), ("a[05,7],b", "a05"),
                                             ("x1,x2", "x1")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_bad_variables_are_clear_errors():
    with pytest.raises(ConfigError, match="GERYON_MODE"):
        RankEnv.from_environ({"GERYON_MODE": "mpi"})
    with pytest.raises(ConfigError, match="RANK='one'"):
        RankEnv.from_environ({"RANK": "one", "WORLD_SIZE": "2"})


@pytest.mark.slow
def test_example_under_slurm_variables_matches_single_process():
    """Two processes started as srun would start them (only Slurm's variables), no launcher."""
    import subprocess

    port = free_port()
    processes = [subprocess.Popen([PYTHON, str(EXAMPLE), *EXAMPLE_ARGS], cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=clean_env(SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                                                SLURM_STEP_NODELIST="localhost", MASTER_ADDR="127.0.0.1",
                                                MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo"))
                 for rank in range(2)]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=120))
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert [p.returncode for p in processes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    records = json_records(outputs[0][0].splitlines())
    assert records[-1]["workers"] == 2 and not outputs[1][0].strip()
    assert loss_curve(records) == pytest.approx(loss_curve(run_single_process(*EXAMPLE_ARGS)), rel=1e-4,
                                                abs=1e-5)
