"""Pool the issue's 100 Mbit/s rows over every run of the current allreduce (twelfth session's
own-chunk chain onward): per row, how often each target was met, and all single collectives pooled.

    python docs/data/linerate/lead17-pooled.py
"""
import json
import pathlib
import statistics

HERE = pathlib.Path(__file__).parent
RUNS = [f"lead12-allreduce-100mbit-{r}" for r in "ijmn"] + [f"lead13-allreduce-100mbit-{r}" for r in "op"] \
    + ["lead14-allreduce-100mbit-q"] + [f"lead16-allreduce-100mbit-{r}" for r in "abc"] \
    + [f"lead17-allreduce-100mbit-{r}" for r in "abc"]

rows: dict[tuple[int, int], list[dict]] = {}
for run in RUNS:
    for line in (HERE / f"{run}.jsonl").read_text().splitlines():
        record = json.loads(line)
        rows.setdefault((record["workers"], record["size_bytes"]), []).append(record | {"run": run})

both_every_row = {run: True for run in RUNS}
print(f"{len(RUNS)} runs; per row: medians of 3 (the issue's form), then every single collective pooled")
print("row          <=1.0x gloo  <=1.05x bound  ratio vs gloo (min-median-max)   pooled geryon / gloo / plain TCP, s")
for (workers, size), records in sorted(rows.items()):
    gloo_ok = sum(r["ratio_vs_gloo"] <= 1.0 for r in records)
    bound_ok = sum(r["ratio_vs_line_rate"] <= 1.05 for r in records)
    for r in records:
        both_every_row[r["run"]] &= r["ratio_vs_gloo"] <= 1.0 and r["ratio_vs_line_rate"] <= 1.05
    ratios = sorted(r["ratio_vs_gloo"] for r in records)
    pooled = [statistics.median(x for r in records for x in r[key])
              for key in ("all_seconds", "gloo_all_seconds", "wire_ring_all_seconds") if all(key in r for r in records)]
    print(f"{workers} x {size / 1e6:>3.0f} MB   {gloo_ok:>2} of {len(records)}     {bound_ok:>2} of {len(records)}       "
          f"{ratios[0]:.4f} {statistics.median(ratios):.4f} {ratios[-1]:.4f}        "
          + " / ".join(f"{p:.4f}" for p in pooled))
print(f"both targets in every row of a run: {sum(both_every_row.values())} of {len(RUNS)} runs "
      f"(missed: {', '.join(run for run, ok in both_every_row.items() if not ok)})")
