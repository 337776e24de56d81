"""`geryon categorize` and `geryon bench threshold` (analytic backend)."""

import json

import pytest

from geryon.cli import main


def test_categorize_builtin_cnn_coarse(capsys):
    assert main(["categorize", "smallcnn"]) == 0
    out = capsys.readouterr().out
    assert "conv1.weight" in out and "class 1: 4 tensors" in out and "digest" in out


def test_categorize_profile_json_with_thresholds(capsys):
    assert main(["categorize", "resnet50", "--threshold", "0.3,0.9", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["assignment"]["classes"] == 3 and len(data["ranking"]) == 107
    assert data["assignment"]["parameters"][-1] == {"name": "fc1000", "bytes": 8196000, "class": 2}
    assert len(data["digest"]) == 64


@pytest.mark.parametrize("name", ["minivgg", "miniresnet", "vgg16", "inceptionv3", "alexnet"])
def test_categorize_every_named_model(name, capsys):
    assert main(["categorize", name, "--classes", "3"]) == 0
    assert "class 2:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["categorize", "vgg19", "--threshold", "0.5,0.2"], "not strictly increasing"),
    (["categorize", "vgg19", "--threshold", "1.2"], "outside [0, 1]"),
    (["categorize", "vgg19", "--classes", "4", "--max-classes", "2"], "only 2"),
    (["categorize", "vgg19", "--classes", "3", "--threshold", "0.5"], "needs 2 thresholds"),
    (["categorize", "lenet"], "unknown profile"),
])
def test_categorize_bad_input(argv, message, capsys):
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_bench_threshold_analytic(tmp_path, capsys):
    run = tmp_path / "RUN.json"
    assert main(["bench", "threshold", "--backend", "analytic", "--model", "resnet50", "--bandwidth", "10gbit",
                 "--json", "--out", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"backend", "chosen", "chosen_iter_s", "sweep_best", "sweep_best_iter_s", "probes"}
    assert result["backend"] == "analytic"
    assert result["probes"] <= 10 and result["true_ratio"] <= 1.03
    assert json.loads(run.read_text())["schema"] == "geryon.threshold-run/1"
