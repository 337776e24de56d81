"""`geryon report threshold`: PNG and Markdown from a RUN.json record; bad records are clear errors."""

import json

import pytest

from geryon.bench.sweep import analytic_measure, profile_context, run_threshold_bench
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.runrecord import load_run, write_run
from geryon.categorize.search import SearchSettings
from geryon.cli import main
from geryon.errors import ConfigError


@pytest.fixture
def run_json(tmp_path):
    profile = resolve_profile("vgg19")
    measure, truth = analytic_measure(profile, 40e9, seed=3)
    record = run_threshold_bench(measure, SearchSettings(), profile_context(profile, backend="analytic"),
                                 true_iter_s=truth)
    return write_run(tmp_path / "RUN.json", record)


def test_report_renders_png_and_markdown(run_json, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "threshold", str(run_json), "--out", str(out)]) == 0
    png, md = out / "threshold.png", out / "threshold.md"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    text = md.read_text()
    for needle in ("chosen threshold", "| 0 (high) | ", "Time per candidate", "Expected saving",
                   "exhaustive sweep", "threshold.png"):
        assert needle in text, needle
    assert "wrote" in capsys.readouterr().out


def test_report_without_sweep_or_tensors(run_json, tmp_path):
    record = load_run(run_json)
    record["sweep"], record["extra"], record["context"] = None, {}, {}
    bare = write_run(tmp_path / "bare.json", record)
    assert main(["report", "threshold", str(bare)]) == 0
    assert (tmp_path / "bare.png").exists() and "Classes" not in (tmp_path / "bare.md").read_text()


def test_bad_records(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something/else"}))
    with pytest.raises(ConfigError, match="missing"):
        load_run(bad)
    assert main(["report", "threshold", str(bad)]) == 1
    assert "geryon: error" in capsys.readouterr().err
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not a JSON"):
        load_run(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_run(tmp_path / "none.json")


def test_report_names_the_workers_a_bench_measured(run_json, tmp_path):
    from geryon.categorize.report import describe_ranks

    record = load_run(run_json)
    assert describe_ranks({"world_size": 4, "context": {}}) == "4 ranks"     # a training run
    record["context"].update(backend="emulated", workers=2, servers=1)     # one driver process
    assert record["world_size"] == 1 and describe_ranks(record) == "2 workers, 1 server"
    emulated = write_run(tmp_path / "emulated.json", record)
    out = tmp_path / "report"
    assert main(["report", "threshold", str(emulated), "--out", str(out)]) == 0
    text = (out / "emulated.md").read_text()
    assert "ranks: 2 workers, 1 server;" in text and "1 rank" not in text


def test_three_class_report_is_a_heat_map_with_the_two_class_comparison(tmp_path):
    profile = resolve_profile("vgg19")
    measure, truth = analytic_measure(profile, 20e9, seed=1)
    record = run_threshold_bench(measure, SearchSettings(classes=3, iters_per_probe=3),
                                 profile_context(profile, backend="analytic"), true_iter_s=truth)
    assert record["sweep"] is None and len(record["chosen_thresholds"]) == 2
    run = write_run(tmp_path / "RUN.json", record)
    assert main(["report", "threshold", str(run)]) == 0
    png, text = tmp_path / "threshold.png", (tmp_path / "threshold.md").read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    for needle in ("3 classes", "chosen thresholds", "fitted iteration time over (t1, t2)",
                   "best two-class split on the surface", "| 1 |", "| 2 (low) |"):
        assert needle in text, needle


def test_a_directory_given_as_the_record_path_gets_run_json_inside(run_json, tmp_path):
    """`bench threshold --out DIR` once lost a 4-minute run to IsADirectoryError at the very end."""
    folder = tmp_path / "out"
    folder.mkdir()
    written = write_run(folder, load_run(run_json))
    assert written == folder / "RUN.json" and load_run(written)["chosen"] == load_run(run_json)["chosen"]
