"""A rank that torchrun or Slurm started: its role, numbering, secret and settings (geryon.runtime.env)."""

import pytest

from geryon.errors import ConfigError
from geryon.runtime.env import RankEnv, split_roles


def torchrun(rank: int, nodes: int = 2, per_node: int = 2, **extra) -> dict[str, str]:
    """The variables torchrun gives engine rank `rank` of `nodes` x `per_node`."""
    return {"RANK": str(rank), "WORLD_SIZE": str(nodes * per_node), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(rank // per_node),
            "GROUP_WORLD_SIZE": str(nodes), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job7",
            "TORCHELASTIC_RESTART_COUNT": "0", **extra}


def test_servers_are_the_first_ranks_and_workers_count_from_zero():
    roles = [split_roles(r, 6, r % 3, 3, r // 3, servers=2, servers_per_node=0) for r in range(6)]
    assert roles == [("server", 0, 4, 2), ("server", 1, 4, 2), ("worker", 0, 4, 2), ("worker", 1, 4, 2),
                     ("worker", 2, 4, 2), ("worker", 3, 4, 2)]


def test_servers_per_node_are_each_nodes_first_local_ranks():
    roles = [split_roles(r, 6, r % 3, 3, r // 3, servers=0, servers_per_node=1) for r in range(6)]
    assert roles == [("server", 0, 4, 2), ("worker", 0, 4, 2), ("worker", 1, 4, 2),
                     ("server", 1, 4, 2), ("worker", 2, 4, 2), ("worker", 3, 4, 2)]


def test_no_servers_keeps_the_engines_numbering():
    assert [split_roles(r, 4, r % 2, 2, r // 2, 0, 0) for r in range(4)] == \
        [("worker", r, 4, 0) for r in range(4)]


@pytest.mark.parametrize("servers, per_node, wanted", [
    (4, 0, "leaves no worker"), (1, 1, "not both"), (0, 2, "more than 2"), (-1, 0, "0 or more")])
def test_impossible_server_counts_say_what_to_change(servers, per_node, wanted):
    with pytest.raises(ConfigError, match=wanted):
        split_roles(0, 4, 0, 2, 0, servers, per_node)


def test_a_torchrun_ps_rank_is_a_server_or_a_renumbered_worker():
    server = RankEnv.from_environ(torchrun(2, GERYON_MODE="ps", GERYON_SERVERS_PER_NODE="1",
                                           GERYON_JOB_SECRET="s"))
    assert (server.role, server.server_rank, server.servers, server.workers, server.name) == \
        ("server", 1, 2, 2, "server1")
    worker = RankEnv.from_environ(torchrun(3, GERYON_MODE="ps", GERYON_SERVERS_PER_NODE="1",
                                           GERYON_JOB_SECRET="s"))
    assert (worker.role, worker.rank, worker.world_size, worker.servers, worker.engine_rank) == \
        ("worker", 1, 2, 2, 3)
    assert (worker.launcher, worker.job_id, worker.store_prefix, worker.agent_store) == \
        ("torchrun", "job7", "geryon/0/", True)


def test_ranks_across_hosts_refuse_to_start_without_the_secret():
    with pytest.raises(ConfigError, match="GERYON_JOB_SECRET_FILE"):
        RankEnv.from_environ(torchrun(0))
    with pytest.raises(ConfigError, match="spans 3 hosts"):
        RankEnv.from_environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_NNODES": "3",
                              "SLURM_STEP_NODELIST": "n[1-3]"})
    one_host = RankEnv.from_environ(torchrun(0, nodes=1))
    assert not one_host.has_transport and one_host.world_size == 2   # gloo carries it, as before


def test_servers_need_ps_mode_and_the_secret():
    with pytest.raises(ConfigError, match="GERYON_MODE=ps"):
        RankEnv.from_environ(torchrun(0, GERYON_SERVERS="1", GERYON_JOB_SECRET="s"))
    with pytest.raises(ConfigError, match="need the job secret"):
        RankEnv.from_environ(torchrun(0, nodes=1, GERYON_MODE="ps", GERYON_SERVERS="1"))


def test_the_secret_comes_from_a_mounted_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123abcd\n")
    env = RankEnv.from_environ(torchrun(1, GERYON_JOB_SECRET_FILE=str(secret)))
    assert env.secret == "0123abcd" and "0123abcd" not in repr(env)
    secret.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        RankEnv.from_environ(torchrun(1, GERYON_JOB_SECRET_FILE=str(secret)))
    with pytest.raises(ConfigError, match="cannot read the job secret"):
        RankEnv.from_environ(torchrun(1, GERYON_JOB_SECRET_FILE=str(tmp_path / "missing")))


def test_a_config_file_gives_the_settings_and_variables_win(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text('mode = "ps"\nservers = 1\npolicy = "slicing"\nclasses = "high:46,low:0"\n'
                      'transport_timeout = 30\n')
    env = RankEnv.from_environ(torchrun(1, GERYON_CONFIG=str(config), GERYON_JOB_SECRET="s",
                                        GERYON_POLICY="geryon"))
    assert (env.mode, env.servers, env.rank, env.policy, env.classes, env.transport_timeout) == \
        ("ps", 1, 0, "geryon", "high:46,low:0", 30.0)


@pytest.mark.parametrize("text, wanted", [('job_secret = "x"\n', "unknown setting 'job_secret'"),
                                          ("mode = [1]\n", "single value"), ("mode = \n", "not valid TOML")])
def test_a_bad_config_file_is_a_clear_error(tmp_path, text, wanted):
    config = tmp_path / "job.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=wanted):
        RankEnv.from_environ(torchrun(0, nodes=1, GERYON_CONFIG=str(config)))


def test_slurm_ranks_split_by_node():
    env = RankEnv.from_environ({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                                "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
                                "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "gpu[1-2]",
                                "GERYON_MODE": "ps", "GERYON_SERVERS_PER_NODE": "1", "GERYON_JOB_SECRET": "s"})
    assert (env.role, env.server_rank, env.workers, env.agent_store, env.job_id, env.master_addr) == \
        ("server", 1, 2, False, "77", "gpu1")
