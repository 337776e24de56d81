"""--priority search in a running job: every rank switches at the same iterations, no update lost."""

import json
import re
import subprocess

import pytest

from geryon.errors import ConfigError
from geryon.runtime.env import RankEnv
from geryon.runtime.search_sync import run_record_path, search_settings
from launch_support import EXAMPLE, EXAMPLE_ARGS, PYTHON, REPO, clean_env, json_records, loss_curve, \
    rank_lines, run_launcher

SWITCH = re.compile(r"geryon: search switch (\d+) before iteration (\d+): threshold (\S+),.*digest (\w+)")
CANDIDATES = [0.0, 0.5, 1.0]


def switches_of(output: str, rank: str) -> list[tuple]:
    return [SWITCH.search(line).groups() for line in rank_lines(output, rank) if SWITCH.search(line)]


@pytest.mark.slow
@pytest.mark.parametrize("mode_args", [["--mode", "allreduce"], ["--mode", "ps", "--servers", "2"],
                                       ["--mode", "ps", "--servers", "2", "--ps-pull", "ahead"]],
                         ids=["allreduce", "ps-2-servers", "ps-2-servers-pull-ahead"])
def test_search_switches_everywhere_and_keeps_the_curve(single_curve, mode_args, tmp_path):
    """Two servers in ps mode: at each switch every server publishes its shards' state and assembles
    the others' (geryon.runtime.server.switched_state), which a single server's job would pass
    through with only its own shards; so one server would run the same code and check less."""
    run = tmp_path / "RUN.json"
    env = clean_env(GERYON_SEARCH_CANDIDATES=",".join(map(str, CANDIDATES)), GERYON_SEARCH_ITERS="2",
                    GERYON_SEARCH_RUN=str(run), GERYON_TRANSPORT_TIMEOUT="20")
    result = run_launcher("--local", "--workers", "2", "--priority", "search", *mode_args, EXAMPLE,
                          *EXAMPLE_ARGS, env=env)
    output = result.stdout + "\n" + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert loss_curve(json_records(rank_lines(result.stdout, "worker0"))) == pytest.approx(
        single_curve, rel=1e-4, abs=1e-5)

    record = json.loads(run.read_text())
    probed = [probe["threshold"] for probe in record["probes"]]
    assert probed[:3] == CANDIDATES and record["chosen"] is not None
    assert [p["round"] for p in record["probes"]] == [1, 1, 1, 3, 3]  # all tried: re-measure the best two
    expected = [(str(s["iteration"]), s["digest"][:12]) for s in record["extra"]["switches"]]
    assert len(expected) >= 2  # 0 -> 0.5 -> 1 at least, then maybe to the chosen threshold
    for rank in ("worker0", "worker1"):
        assert [(it, digest) for _n, it, _t, digest in switches_of(output, rank)] == expected
    if mode_args[1] == "ps":
        for server in range(int(mode_args[3])):
            switched = [line for line in rank_lines(output, f"server{server}") if "switched" in line]
            assert len(switched) == len(expected)

    report = subprocess.run([PYTHON, "-m", "geryon", "report", "threshold", str(run)],
                                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "threshold.png").stat().st_size > 0  # RUN.json's report: threshold.png + .md
    assert "chosen" in (tmp_path / "threshold.md").read_text().lower()


def test_settings_come_from_the_environment():
    settings = search_settings(RankEnv.from_environ({
        "GERYON_SEARCH_CANDIDATES": "0, 0.25,1", "GERYON_SEARCH_ITERS": "3", "GERYON_SEARCH_WARMUP": "0",
        "GERYON_SEARCH_BUDGET": "4"}))
    assert settings.candidates == (0.0, 0.25, 1.0) and settings.iters_per_probe == 3
    assert settings.warmup == 0 and settings.budget == 4
    assert search_settings(RankEnv()).iters_per_probe == 5  # the measured defaults otherwise


@pytest.mark.parametrize("env", [{"GERYON_SEARCH_CANDIDATES": "0,x"}, {"GERYON_SEARCH_CANDIDATES": "0.5,1.5"},
                                 {"GERYON_SEARCH_ITERS": "two"}, {"GERYON_SEARCH_ITERS": "1"}])
def test_bad_settings_are_clear_errors(env):
    with pytest.raises(ConfigError, match="GERYON_SEARCH"):
        search_settings(RankEnv.from_environ(env))


def test_run_record_goes_next_to_the_timeline(tmp_path):
    assert run_record_path(RankEnv(search_run="/x/r.json")).as_posix() == "/x/r.json"
    assert run_record_path(RankEnv(timeline=str(tmp_path / "trace.json"))) == tmp_path / "trace.RUN.json"


def test_blobs_larger_than_a_store_message_round_trip():
    from datetime import timedelta

    import torch

    from geryon.runtime.store_blobs import CHUNK_BYTES, get_blob, put_blob

    store = torch.distributed.HashStore()
    store.set_timeout(timedelta(seconds=2))
    data = bytes(range(256)) * (2 * CHUNK_BYTES // 256 + 7)
    put_blob(store, "k", data)
    put_blob(store, "empty", b"")
    assert get_blob(store, "k") == data and get_blob(store, "empty") == b""
    assert store.get("k") == b"3"  # the count comes last: seeing the key means every chunk is there


def test_settings_for_k_classes_come_from_the_environment():
    settings = search_settings(RankEnv.from_environ({"GERYON_SEARCH_CLASSES": "3", "GERYON_SEARCH_CONFIRM": "0"}))
    assert settings.classes == 3 and settings.method == "gp" and settings.budget == 16 and settings.confirm == 0
    with pytest.raises(ConfigError, match="GERYON_SEARCH"):
        search_settings(RankEnv.from_environ({"GERYON_SEARCH_CLASSES": "3", "GERYON_SEARCH_METHOD": "fit"}))


@pytest.mark.root
@pytest.mark.slow
def test_three_class_search_on_the_emulated_cluster_switches_every_rank_and_keeps_the_curve(single_curve,
                                                                                             tmp_path):
    """--max-classes 3: two thresholds searched in training; workers and server switch together, exactly."""
    run = tmp_path / "RUN.json"
    env = clean_env(GERYON_SEARCH_CANDIDATES="0.25,0.5,0.75", GERYON_SEARCH_ITERS="2",
                    GERYON_SEARCH_RUN=str(run), GERYON_TRANSPORT_TIMEOUT="30")
    result = run_launcher("--emulate", "--bw", "1gbit", "--workers", "2", "--mode", "ps", "--servers", "1",
                          "--priority", "search", "--max-classes", "3", EXAMPLE, *EXAMPLE_ARGS, env=env,
                          timeout=300)
    output = result.stdout + "\n" + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "emulated star cluster" in result.stderr
    # nothing lost or applied twice across the switches: the same losses as one process
    assert loss_curve(json_records(rank_lines(result.stdout, "worker0"))) == pytest.approx(
        single_curve, rel=1e-4, abs=1e-5)

    record = json.loads(run.read_text())
    assert record["settings"]["classes"] == 3 and len(record["chosen_thresholds"]) == 2
    assert [p["thresholds"] for p in record["probes"]][:3] == [[0.25, 0.5], [0.25, 0.75], [0.5, 0.75]]
    assert record["surface"] and len(record["surface"]["axis"]) == 3
    switches = record["extra"]["switches"]
    expected = [(str(s["iteration"]), s["digest"][:12]) for s in switches]
    assert len(expected) >= 2
    for rank in ("worker0", "worker1"):
        lines = switches_of(output, rank)
        assert [(it, digest) for _n, it, _t, digest in lines] == expected
        assert all(t.count(",") == 1 for _n, _it, t, _d in lines)  # two thresholds per switch
    switched = [line for line in rank_lines(output, "server0") if "switched" in line]
    assert len(switched) == len(expected)
    assert any(line.count(",") >= 2 for line in rank_lines(output, "worker0") if "bytes per class" in line)

    report = subprocess.run([PYTHON, "-m", "geryon", "report", "threshold", str(run)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "threshold.md").read_text()
    assert "3 classes" in text and "fitted iteration time over (t1, t2)" in text
    assert (tmp_path / "threshold.png").stat().st_size > 20_000


def test_max_classes_flag(tmp_path):
    from geryon.launch.config import parse_launch_args
    from geryon.launch.environment import job_environment
    from geryon.launch.placement import RankSpec

    script = tmp_path / "train.py"
    script.write_text("")
    config = parse_launch_args(["--local", "--priority", "search", "--max-classes", "3", str(script)], environ={})
    assert config.max_classes == 3 and config.classes == "high:46,medium:34,low:0"
    spec = RankSpec(role="worker", index=0, host=0, local_rank=0)
    assert job_environment(config, spec, "127.0.0.1", 1, 1)["GERYON_SEARCH_CLASSES"] == "3"
    for argv, message in ((["--max-classes", "3"], "--priority search"),
                          (["--priority", "search", "--max-classes", "3", "--classes", "2"], "at least 3"),
                          (["--priority", "search", "--max-classes", "1"], "at least 2")):
        with pytest.raises(ConfigError, match=message):
            parse_launch_args(["--local", *argv, str(script)], environ={})
