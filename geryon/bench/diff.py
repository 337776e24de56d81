"""`geryon bench diff A B`: compare two JSON records of the same bench, row by row.

    geryon bench diff before.jsonl after.jsonl [--keys workers,size_bytes,...] [--json]

A and B are what a bench wrote: `bench allreduce --json`, `bench transport --json` or `bench priority
--json` (one JSON object per line; other lines are skipped), or `bench paper --out DIR`'s paper.json
(its `rows` and `slicing_rows`). Rows are matched by their keys (KEY_FIELDS: bench, table, system,
model, link, workers, servers, hosts, layout, size_bytes, slice_params, bw, congestion, policy; those a
row has). Rows of one file with the same keys are pooled, so several runs appended to one file count
as repetitions.

For every timed figure a matched row has in both files (TIMED_FIGURES: a figure and the field that
holds its repetitions, e.g. `seconds` and `all_seconds`), it prints the median in A and in B, the
ratio B/A (below 1: B is faster) and, where both sides have at least two repetitions, the two-sided
Mann-Whitney U p-value of "A and B come from the same distribution" (scipy.stats.mannwhitneyu). A row
of one file that the other lacks is listed, not compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from geryon.errors import ConfigError

KEY_FIELDS = ("bench", "table", "system", "model", "link", "workers", "servers", "hosts", "layout",
              "size_bytes", "slice_params", "bw", "congestion", "policy")
# figure -> the field holding its repetitions (None: the figure is its only sample)
TIMED_FIGURES = {
    "seconds": "all_seconds",                      # bench allreduce, bench transport
    "gloo_seconds": "gloo_all_seconds",            # bench allreduce
    "wire_ring_seconds": "wire_ring_all_seconds",  # bench allreduce
    "iteration_s": "times",                        # bench paper
    "compute_s": None,                             # bench paper
    "unloaded_seconds": None,                      # bench priority
    "loaded_seconds": None,                        # bench priority
}
MIN_REPETITIONS = 2   # per side, for a p-value


@dataclass(frozen=True)
class FigureDiff:
    """One timed figure of one matched row: medians, ratio B/A, p-value (None: too few repetitions)."""
    key: dict
    figure: str
    a_median: float
    b_median: float
    ratio: float
    p_value: float | None
    a_count: int
    b_count: int


def load_rows(path: str | Path) -> list[dict]:
    """The result rows of a bench record: JSON lines, a JSON list of rows, or bench paper's paper.json."""
    from geryon.sim.compare import read_record   # lazy: it pulls in numpy and the simulator

    whole = read_record(path)
    if isinstance(whole, dict) and "rows" in whole:
        rows = [{"bench": "paper", **row} for row in whole["rows"] + whole.get("slicing_rows", [])]
    elif isinstance(whole, dict):
        rows = [whole]
    else:
        rows = [row for row in whole if isinstance(row, dict)] if isinstance(whole, list) else []
    rows = [row for row in rows if any(figure in row for figure in TIMED_FIGURES)]
    if not rows:
        raise ConfigError(f"{path} holds no bench result rows: give what `geryon bench allreduce|transport|"
                          "priority --json` printed, or `geryon bench paper --out`'s paper.json")
    return rows


def row_key(row: dict, keys: tuple[str, ...] = KEY_FIELDS) -> tuple:
    """The fields that identify a row (those of `keys` it has), as a hashable tuple of (name, value)."""
    return tuple((name, json.dumps(row[name], sort_keys=True)) for name in keys if name in row)


def samples(row: dict, figure: str) -> list[float]:
    """A row's repetitions of `figure`: its repetitions field, else the figure itself (none if absent)."""
    repetitions = TIMED_FIGURES.get(figure)
    values = row.get(repetitions) if repetitions else None
    if isinstance(values, list) and values and all(isinstance(v, (int, float)) for v in values):
        return [float(v) for v in values]
    value = row.get(figure)
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _pooled(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, dict[str, list[float]]]:
    pooled: dict[tuple, dict[str, list[float]]] = {}
    for row in rows:
        figures = pooled.setdefault(row_key(row, keys), {})
        for figure in TIMED_FIGURES:
            values = samples(row, figure)
            if values:
                figures.setdefault(figure, []).extend(values)
    return pooled


def mann_whitney_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value of A vs B (None with fewer than MIN_REPETITIONS on a side)."""
    if len(a) < MIN_REPETITIONS or len(b) < MIN_REPETITIONS:
        return None
    from scipy.stats import mannwhitneyu   # lazy: scipy takes a while to import

    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def diff_rows(a_rows: list[dict], b_rows: list[dict],
              keys: tuple[str, ...] = KEY_FIELDS) -> tuple[list[FigureDiff], list[dict], list[dict]]:
    """(the figures of every row in both, the keys of the rows only in A, those only in B)."""
    a, b = _pooled(a_rows, keys), _pooled(b_rows, keys)
    if not set(a) & set(b):
        raise ConfigError(f"no row of A has the keys of a row of B ({', '.join(keys)}): are they records "
                          "of the same bench? --keys picks the fields that identify a row")
    diffs = []
    for key in (k for k in a if k in b):
        for figure in TIMED_FIGURES:
            if figure in a[key] and figure in b[key]:
                xs, ys = a[key][figure], b[key][figure]
                a_median, b_median = statistics.median(xs), statistics.median(ys)
                diffs.append(FigureDiff(_decoded(key), figure, a_median,
                                        b_median, b_median / a_median if a_median else float("nan"),
                                        mann_whitney_p(xs, ys), len(xs), len(ys)))
    return diffs, [_decoded(k) for k in a if k not in b], [_decoded(k) for k in b if k not in a]


def _decoded(key: tuple) -> dict:
    return {name: json.loads(value) for name, value in key}


def _describe(key: dict) -> str:
    return " ".join(f"{name}={value}" for name, value in key.items())


def format_diffs(diffs: list[FigureDiff], only_a: list[dict], only_b: list[dict]) -> str:
    """The comparison as a plain-text table, then the rows that only one side has."""
    width = max([len("row")] + [len(_describe(d.key)) for d in diffs])
    lines = [f"{'row':<{width}}  {'figure':<18} {'A median':>10} {'B median':>10} {'B/A':>7} {'p':>7}  n(A,B)"]
    for d in diffs:
        p = f"{d.p_value:.3g}" if d.p_value is not None else "-"
        lines.append(f"{_describe(d.key):<{width}}  {d.figure:<18} {d.a_median:>10.4g} {d.b_median:>10.4g} "
                     f"{d.ratio:>7.4f} {p:>7}  {d.a_count},{d.b_count}")
    lines += [f"only in A: {_describe(k)}" for k in only_a] + [f"only in B: {_describe(k)}" for k in only_b]
    return "\n".join(lines)


def cmd_diff(args) -> int:
    keys = tuple(k.strip() for k in args.keys.split(",") if k.strip()) if args.keys else KEY_FIELDS
    diffs, only_a, only_b = diff_rows(load_rows(args.a), load_rows(args.b), keys)
    if args.json:
        for d in diffs:
            print(json.dumps(asdict(d)))
        for side, missing in (("a", only_a), ("b", only_b)):
            for key in missing:
                print(json.dumps({"only_in": side, "key": key}))
    else:
        print(format_diffs(diffs, only_a, only_b))
    return 0


def add_command(bench) -> None:
    parser = bench.add_parser(
        "diff", help="compare two JSON records of the same bench (medians, B/A, Mann-Whitney p)",
        description=__doc__.split("\n", 1)[1].strip(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="record A: bench allreduce/transport/priority --json output, or paper.json")
    parser.add_argument("b", help="record B, of the same bench")
    parser.add_argument("--keys", default=None,
                        help=f"comma-separated fields that identify a row (default: {','.join(KEY_FIELDS)}, "
                        "those a row has); drop one to compare rows that differ in it, e.g. policy")
    parser.add_argument("--json", action="store_true", help="one JSON object per compared figure")
    parser.set_defaults(func=cmd_diff)
