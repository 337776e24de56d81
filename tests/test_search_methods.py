"""The bootstrap of the done-criterion from a measured sweep (geryon.bench.search_methods)."""

from geryon.bench.search_methods import evaluate_criterion, main
from geryon.bench.sweep import run_threshold_bench
from geryon.categorize.search import SearchSettings


def _record(curve: dict[float, float], iters: int = 8, warmup: int = 2) -> dict:
    """A RUN.json of the bench on a noise-free curve (2-pass sweep), as an emulated run writes it."""
    settings = SearchSettings(candidates=tuple(curve), iters_per_probe=iters, warmup=warmup)
    return run_threshold_bench(lambda t: curve[t], settings, {"model": "synthetic"}, sweep_passes=2)


def test_criterion_on_a_noise_free_curve_is_met_by_search_and_yardstick():
    record = _record({0.0: 1.2, 0.25: 1.1, 0.5: 1.0, 0.75: 1.05, 1.0: 1.2})
    ratios, yardstick = evaluate_criterion(record, iters_per_probe=6, sweep_passes=2, seeds=3)
    assert ratios.tolist() == [1.0] * 3 and yardstick.tolist() == [1.0] * 3


def test_criterion_cli_prints_one_row_per_shape(tmp_path, capsys):
    import json

    path = tmp_path / "RUN.json"
    path.write_text(json.dumps(_record({0.0: 1.2, 0.5: 1.0, 1.0: 1.2})))
    assert main(["--replay", str(path), "--criterion", "4x1,6x2", "--seeds", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["iters_per_probe"], r["sweep_passes"]) for r in rows] == [(4, 1), (6, 2)]
    assert all(r["within_3pct"] == 1.0 and r["yardstick_beyond_3pct"] == 0.0 for r in rows)


def test_table_prints_a_row_per_run(tmp_path, capsys):
    import json

    path = tmp_path / "RUN.json"
    path.write_text(json.dumps(_record({0.0: 1.2, 0.5: 1.0, 1.0: 1.2})))
    assert main(["--table", str(path)]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert "| synthetic | 0.5 | 0.5 | 1.000 within |" in row
