"""The launcher's command line: every flag, its environment twin, and errors before anything starts."""

import os

import pytest

from geryon.errors import ConfigError, PermissionNeeded, RateError
from geryon.launch.config import ENV_TWINS, LaunchConfig, parse_launch_args
from launch_support import REPO, clean_env, run_launcher

SCRIPT = str(REPO / "examples" / "train_cnn.py")


def parse(*argv, **env):
    return parse_launch_args([*argv], environ=env)


def test_defaults_and_script_args():
    config = parse("--local", SCRIPT, "--iterations", "5", "--mode", "x")
    assert isinstance(config, LaunchConfig)
    assert (config.mode, config.workers, config.servers, config.policy, config.priority) == (
        "allreduce", 2, 0, "geryon", "coarse")
    assert config.backend == "local"
    assert config.script == SCRIPT
    assert config.script_args == ("--iterations", "5", "--mode", "x")  # the script's, not ours
    assert len(config.job_id) == 6 and config.secret not in repr(config)


def test_ps_mode_gets_one_server_by_default():
    config = parse("--local", "--mode", "ps", "--workers", "4", SCRIPT)
    assert (config.workers, config.servers, config.ranks) == (4, 1, 5)


def test_every_flag_has_an_env_twin():
    env = {"GERYON_MODE": "ps", "GERYON_WORKERS": "3", "GERYON_SERVERS": "2", "GERYON_POLICY": "vanilla",
           "GERYON_PRIORITY": "threshold=0.25", "GERYON_CLASSES": "3", "GERYON_LOCAL": "1",
           "GERYON_TIMEOUT": "60", "GERYON_GRACE": "1.5", "GERYON_TIMELINE": "/tmp/t.json"}
    config = parse(SCRIPT, **env)
    assert (config.mode, config.workers, config.servers, config.policy) == ("ps", 3, 2, "vanilla")
    assert config.priority == "threshold=0.25"
    assert config.classes.count(":") == 3
    assert (config.backend, config.timeout, config.grace, config.timeline) == ("local", 60, 1.5, "/tmp/t.json")
    assert set(ENV_TWINS) >= {"mode", "workers", "servers", "policy", "priority", "classes", "emulate", "bw",
                              "topology", "local", "hostfile", "timeline", "timeout"}


def test_ps_optimizer_flag_and_twin():
    assert parse("--local", "--mode", "ps", SCRIPT).ps_optimizer == "auto"
    assert parse("--local", "--mode", "ps", "--ps-optimizer", "worker", SCRIPT).ps_optimizer == "worker"
    assert parse("--local", "--mode", "ps", SCRIPT, GERYON_PS_OPTIMIZER="server").ps_optimizer == "server"


def test_ps_pull_flag_and_twin():
    assert parse("--local", "--mode", "ps", SCRIPT).ps_pull == "auto"
    assert parse("--local", "--mode", "ps", "--ps-pull", "ahead", SCRIPT).ps_pull == "ahead"
    assert parse("--local", "--mode", "ps", SCRIPT, GERYON_PS_PULL="end").ps_pull == "end"


def test_ps_placement_flag_twin_and_rank_environment():
    from geryon.launch.environment import job_environment
    from geryon.launch.placement import place_on_one_host
    assert parse("--local", "--mode", "ps", SCRIPT).ps_placement == "bytes"
    assert parse("--local", "--mode", "ps", "--ps-placement", "count", SCRIPT).ps_placement == "count"
    config = parse("--local", "--mode", "ps", SCRIPT, GERYON_PS_PLACEMENT="count")
    assert config.ps_placement == "count"
    every_rank = {job_environment(config, spec, "127.0.0.1", 1, 1)["GERYON_PS_PLACEMENT"]
                  for spec in place_on_one_host(config)}
    assert every_rank == {"count"}   # workers and servers alike: the plan digest needs them to agree


def test_server_device_flag_twin_rank_environment_and_refusals():
    from geryon.launch.environment import job_environment
    from geryon.launch.placement import place_on_one_host
    from geryon.runtime.env import RankEnv
    assert parse("--local", "--mode", "ps", SCRIPT).server_device == "cpu"
    config = parse("--local", "--mode", "ps", "--server-device", "cuda", SCRIPT)
    assert config.server_device == "cuda"
    assert parse("--local", "--mode", "ps", SCRIPT, GERYON_SERVER_DEVICE="cuda").server_device == "cuda"
    ranks = [job_environment(config, spec, "127.0.0.1", 1, 1) for spec in place_on_one_host(config)]
    assert {RankEnv.from_environ(env).server_device for env in ranks} == {"cuda"}
    with pytest.raises(ConfigError, match="--server-device cuda applies to --mode ps only"):
        parse("--local", "--server-device", "cuda", SCRIPT)
    with pytest.raises(ConfigError, match="--server-device"):
        parse("--local", "--mode", "ps", "--server-device", "tpu", SCRIPT)
    with pytest.raises(ConfigError, match="GERYON_SERVER_DEVICE='gpu': use cpu, cuda"):
        RankEnv.from_environ({"GERYON_SERVER_DEVICE": "gpu"})


def test_flag_wins_over_twin():
    assert parse("--local", "--workers", "5", SCRIPT, GERYON_WORKERS="3").workers == 5


@pytest.mark.skipif(os.geteuid() != 0, reason="the emulated backend needs root")
def test_emulate_flags():
    config = parse("--emulate", "--bw", "1gbit", "--topology", "leafspine", SCRIPT)
    assert (config.backend, config.bw, config.topology) == ("emulate", 10**9, "leafspine")
    assert parse(SCRIPT, GERYON_BW="10mbit").backend == "emulate"  # the default as root


@pytest.mark.parametrize("argv, env, message", [
    (["--local", "no_such_script.py"], {}, "not found"),
    (["--local", "--policy", "fastest", SCRIPT], {}, "unknown --policy 'fastest'"),
    (["--local", SCRIPT], {"GERYON_POLICY": "fastest"}, "unknown --policy"),
    (["--local", "--mode", "mpi", SCRIPT], {}, "unknown --mode"),
    (["--local", "--priority", "urgent", SCRIPT], {}, "unknown --priority"),
    (["--local", "--priority", "threshold=-1", SCRIPT], {}, "positive number"),
    (["--local", "--workers", "0", SCRIPT], {}, "at least 1"),
    (["--local", "--workers", "two", SCRIPT], {}, "not a whole number"),
    (["--local", "--servers", "2", SCRIPT], {}, "--mode ps only"),
    (["--local", "--mode", "ps", "--servers", "0", SCRIPT], {}, "at least one server"),
    (["--local", "--bw", "1gbit", SCRIPT], {}, "emulated cluster"),
    (["--local", "--emulate", SCRIPT], {}, "exclude each other"),
    (["--local", "--timeout", "0", SCRIPT], {}, "positive"),
    (["--local", "--timeline", "/no/such/dir/t.json", SCRIPT], {}, "does not exist"),
    ([SCRIPT], {"GERYON_LOCAL": "maybe"}, "use 1 or 0"),
    (["--local", "--ps-optimizer", "worker", SCRIPT], {}, "--mode ps only"),
    (["--local", "--mode", "ps", "--ps-optimizer", "gpu", SCRIPT], {}, "unknown --ps-optimizer"),
    (["--local", "--ps-pull", "ahead", SCRIPT], {}, "--mode ps only"),
    (["--local", "--mode", "ps", "--ps-pull", "early", SCRIPT], {}, "unknown --ps-pull"),
    (["--local", "--ps-placement", "count", SCRIPT], {}, "--mode ps only"),
    (["--local", "--mode", "ps", "--ps-placement", "even", SCRIPT], {}, "unknown --ps-placement"),
])
def test_bad_input_is_a_clear_error(argv, env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse(*argv, **env)


def test_bad_rate_and_bad_classes():
    if os.geteuid() != 0:
        with pytest.raises(PermissionNeeded):
            parse("--emulate", SCRIPT)
        return
    with pytest.raises(RateError):
        parse("--emulate", "--bw", "fast", SCRIPT)
    with pytest.raises(ConfigError):
        parse("--local", "--classes", "high:99,low:0", SCRIPT)


def test_hostfile_errors(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    bad_line = tmp_path / "bad_line"
    bad_line.write_text("127.0.0.1 slots=2\n127.0.0.2 speed=fast\n")
    with pytest.raises(ConfigError, match="bad_line:2: bad entry 'speed=fast'"):
        parse("--hostfile", str(bad_line), "--known-hosts", str(known), SCRIPT)
    unknown = tmp_path / "unknown"
    unknown.write_text("127.0.0.1\nno-such-host.invalid:2222\n")
    with pytest.raises(ConfigError, match="unknown:2: unknown host 'no-such-host.invalid'"):
        parse("--hostfile", str(unknown), "--known-hosts", str(known), SCRIPT)
    two = tmp_path / "two"
    two.write_text("127.0.0.1:2201 slots=4\n127.0.0.1:2202 slots=4\n")
    with pytest.raises(ConfigError, match="3 servers need 3 hosts"):
        parse("--hostfile", str(two), "--known-hosts", str(known), "--mode", "ps", "--servers", "3", SCRIPT)
    with pytest.raises(ConfigError, match="9 workers need 9 slots"):
        parse("--hostfile", str(two), "--known-hosts", str(known), "--workers", "9", SCRIPT)
    with pytest.raises(ConfigError, match="known_hosts file .* does not exist"):
        parse("--hostfile", str(two), "--known-hosts", str(tmp_path / "none"), SCRIPT)
    config = parse("--hostfile", str(two), "--known-hosts", str(known), SCRIPT)
    assert (config.backend, config.workers, len(config.hosts)) == ("ssh", 8, 2)


def test_launcher_reports_bad_input_before_starting(tmp_path):
    """The real command: exit code 2, one clear line, no banner (nothing started)."""
    result = run_launcher("--local", "--policy", "fastest", SCRIPT, timeout=60)
    assert result.returncode == 2
    assert "unknown --policy 'fastest'; choose one of vanilla, slicing, endhost, geryon" in result.stderr
    assert "job " not in result.stderr
    result = run_launcher("--local", str(tmp_path / "missing.py"), timeout=60, env=clean_env())
    assert result.returncode == 2 and "not found" in result.stderr


@pytest.mark.parametrize("flag", ["--nproc-per-node", "--nproc_per_node", "--workers"])
def test_torchruns_nproc_per_node_is_an_alias_of_workers(flag):
    config = parse("--local", flag, "3", SCRIPT, "--nproc-per-node", "9")
    assert config.workers == 3 and config.script_args == ("--nproc-per-node", "9")  # after SCRIPT: the script's
