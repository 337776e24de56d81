"""`geryon bench diff`: two records of one bench, matched row by row, in the formats the benches write
(tests/data/bench-*: `bench allreduce --json` lines and `bench paper --out`'s paper.json, their fields
copied from real records)."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from geryon.bench.diff import diff_rows, load_rows, mann_whitney_p
from geryon.errors import ConfigError

DATA = Path(__file__).parent / "data"


def test_allreduce_rows_pool_runs_and_compare_each_timed_figure():
    diffs, only_a, only_b = diff_rows(load_rows(DATA / "bench-allreduce-a.jsonl"),
                                      load_rows(DATA / "bench-allreduce-b.jsonl"))
    by_figure = {d.figure: d for d in diffs}
    assert set(by_figure) == {"seconds", "gloo_seconds"}        # the 8-rank row, the only one in both
    ours = by_figure["seconds"]
    assert ours.key["workers"] == 8 and ours.key["policy"] == "geryon" and ours.key["bench"] == "allreduce"
    assert (ours.a_count, ours.b_count) == (3, 6)               # B's two runs of the row pooled
    assert ours.a_median == pytest.approx(1.469)
    assert ours.b_median == pytest.approx(statistics.median([1.40, 1.41, 1.42, 1.43, 1.39, 1.44]))
    assert ours.ratio == pytest.approx(1.415 / 1.469)
    assert ours.p_value == pytest.approx(2 / 84)                # every B below every A: 2 of C(9, 3) orders
    assert [k["workers"] for k in only_a] == [4] and [k["workers"] for k in only_b] == [3]


def test_paper_records_compare_iteration_times_per_policy():
    diffs, only_a, only_b = diff_rows(load_rows(DATA / "bench-paper-a.json"), load_rows(DATA / "bench-paper-b.json"))
    iteration = {d.key["policy"]: d for d in diffs if d.figure == "iteration_s"}
    assert set(iteration) == {"vanilla", "geryon"} and not only_a and not only_b
    vanilla = iteration["vanilla"]
    assert (vanilla.a_median, vanilla.b_median) == (5.76, 5.64)
    assert vanilla.p_value == pytest.approx(0.7)               # U = 3 of 9: 7 of 20 orders as extreme, twice
    assert iteration["geryon"].ratio == pytest.approx(1.65 / 1.68)
    compute = [d for d in diffs if d.figure == "compute_s"]
    assert compute and all(d.p_value is None and d.a_count == 1 for d in compute)   # one sample: no p-value


def test_records_of_different_benches_do_not_match_until_keys_say_so():
    with pytest.raises(ConfigError, match="same bench"):
        diff_rows(load_rows(DATA / "bench-allreduce-a.jsonl"), load_rows(DATA / "bench-paper-a.json"))
    a = [{"bench": "allreduce", "workers": 8, "policy": "vanilla", "seconds": 2.0, "all_seconds": [2.0, 2.1]}]
    b = [{"bench": "allreduce", "workers": 8, "policy": "geryon", "seconds": 1.0, "all_seconds": [1.0, 1.1]}]
    with pytest.raises(ConfigError):
        diff_rows(a, b)
    (diff,), _, _ = diff_rows(a, b, keys=("bench", "workers"))   # policy dropped: an A/B of two policies
    assert diff.ratio == pytest.approx(1.05 / 2.05)


def test_a_file_without_rows_is_refused_with_what_to_give(tmp_path):
    path = tmp_path / "log.txt"
    path.write_text("cluster up\n{\"event\": \"ready\"}\n")
    with pytest.raises(ConfigError, match="--json"):
        load_rows(path)
    assert mann_whitney_p([1.0], [2.0, 3.0]) is None


def test_the_command_prints_the_table_and_json():
    args = [sys.executable, "-m", "geryon", "bench", "diff", str(DATA / "bench-allreduce-a.jsonl"),
            str(DATA / "bench-allreduce-b.jsonl")]
    table = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "only in A: bench=allreduce workers=4" in table and "only in B: bench=allreduce workers=3" in table
    row = next(line for line in table.splitlines() if " seconds " in line and "workers=8" in line)
    assert row.split()[-4:] == ["1.415", f"{1.415 / 1.469:.4f}", f"{2 / 84:.3g}", "3,6"]
    lines = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120,
                           check=True).stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert {r.get("figure") for r in records if "figure" in r} == {"seconds", "gloo_seconds"}
    assert sorted(r["only_in"] for r in records if "only_in" in r) == ["a", "b"]
