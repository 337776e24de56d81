"""An old/new A/B of the allreduce bench, per position of the three timed collectives: geryon's and gloo's
seconds with each tree (records tagged `tree`), a two-sided Mann-Whitney test of new against old, then
each round's median of 3 against gloo's. The thirty-first session's two A/Bs: the closing barrier
(old: a rank went on to its results and teardown as soon as its own last collective ended; new: every
rank first waits for every other rank's end), and the warm-up on the timed collectives' own buffers
(old: on a copy, so geryon's first timed collective prepared a new plan).

    python docs/data/linerate/lead31-barrier-ab.py lead31-barrier-ab-1gbit.jsonl
    python docs/data/linerate/lead31-barrier-ab.py lead31-warmup-ab-1gbit.jsonl
"""
import json
import pathlib
import statistics
import sys

from scipy.stats import mannwhitneyu

path = pathlib.Path(sys.argv[1])
path = path if path.exists() else pathlib.Path(__file__).parent / path
records = [json.loads(line) for line in path.read_text().splitlines()]
trees = ("old", "new")
print(f"{len(records)} runs, {path.name}")
for system, key in (("geryon", "all_seconds"), ("gloo", "gloo_all_seconds")):
    print(f"{system}: median seconds per position (n per tree), new vs old")
    for position in range(3):
        old, new = ([r[key][position] for r in records if r["tree"] == tree] for tree in trees)
        p = mannwhitneyu(new, old, alternative="two-sided").pvalue
        print(f"  collective {position + 1}: old {statistics.median(old):.4f} (n={len(old)}, max {max(old):.4f})  "
              f"new {statistics.median(new):.4f} (n={len(new)}, max {max(new):.4f})  p = {p:.2g}")
    old, new = ([x for r in records if r["tree"] == tree for x in r[key]] for tree in trees)
    p = mannwhitneyu(new, old, alternative="two-sided").pvalue
    print(f"  all three: old {statistics.median(old):.4f}  new {statistics.median(new):.4f}  p = {p:.2g}")
for tree in trees:
    ratios = [r["ratio_vs_gloo"] for r in records if r["tree"] == tree]
    print(f"{tree}: median of 3 vs gloo's {' '.join(f'{x:.4f}' for x in ratios)}; at most 1.0 in "
          f"{sum(x <= 1.0 for x in ratios)} of {len(ratios)}")
