"""Pool the 1 Gbit/s row (8 ranks x 100 MB) over every run since the twenty-eighth session's scratch
fix (5eb9712): per run the issue's form (median of 3 against gloo's, same run), then every single
collective pooled per system, a one-sided Mann-Whitney test of geryon's collectives against gloo's,
and, resampling the pooled collectives, the chance that one run's median of 3 is at most gloo's.
Later runs are added by name (the stem of their .jsonl here); with --only, just the runs named.

    python docs/data/linerate/lead31-pooled-1gbit.py [--only] [LATER_RUN ...]
"""
import json
import pathlib
import random
import statistics
import sys

from scipy.stats import mannwhitneyu

HERE = pathlib.Path(__file__).parent
RUNS = [f"lead28-allreduce-1gbit-{r}" for r in "efghij"] + [f"lead29-allreduce-1gbit-{r}" for r in "abcd"] \
    + [f"lead30-allreduce-1gbit-{r}" for r in "ab"]
if "--only" in sys.argv:
    RUNS = []
RUNS += [arg for arg in sys.argv[1:] if arg != "--only"]
SYSTEMS = {"geryon": "all_seconds", "gloo": "gloo_all_seconds", "plain TCP": "wire_ring_all_seconds"}

records = [json.loads(line) | {"run": run} for run in RUNS for line in (HERE / f"{run}.jsonl").read_text().splitlines()]
print(f"{len(records)} runs of 8 ranks x 100 MB at 1 Gbit/s (ring bound {records[0]['line_rate_seconds']:.4f} s)")
print("run                          geryon's three, s           gloo's three, s             median vs gloo")
for r in records:
    mark = "" if r["ratio_vs_gloo"] <= 1.0 else "   MISS"
    print(f"{r['run']:<28} {' '.join(f'{x:.4f}' for x in r['all_seconds']):<27} "
          f"{' '.join(f'{x:.4f}' for x in r['gloo_all_seconds']):<27} {r['ratio_vs_gloo']:.4f}{mark}")
met = sum(r["ratio_vs_gloo"] <= 1.0 for r in records)
print(f"median of 3 at most gloo's: {met} of {len(records)}")

pooled = {name: [x for r in records for x in r.get(key, [])] for name, key in SYSTEMS.items()}
print("\npooled single collectives   n    median     p10       p90       vs plain TCP's median")
for name, times in pooled.items():
    deciles = statistics.quantiles(times, n=10)
    print(f"  {name:<24} {len(times):>3}  {statistics.median(times):.4f}  {deciles[0]:.4f}  {deciles[-1]:.4f}  "
          f"{statistics.median(times) / statistics.median(pooled['plain TCP']):.4f}")
test = mannwhitneyu(pooled["geryon"], pooled["gloo"], alternative="less")
print(f"geryon's collectives shorter than gloo's: one-sided Mann-Whitney p = {test.pvalue:.2g}")
rng = random.Random(31)
trials = 100_000
wins = sum(statistics.median(rng.choices(pooled["geryon"], k=3)) <= statistics.median(rng.choices(pooled["gloo"], k=3))
           for _ in range(trials))
print(f"resampled: a run's median of 3 at most gloo's with a chance of {wins / trials:.3f}")
