"""Summarise lead30-ps-vanilla-ab-1gbit.jsonl: the vanilla PS 8 x 8 rows of each tree (old: a fresh mean
gradient tensor per update; new: one reused buffer), with medians and a two-sided Mann-Whitney p per field.

    python docs/data/linerate/lead30-ps-vanilla-ab.py docs/data/linerate/lead30-ps-vanilla-ab-1gbit.jsonl
"""
import json
import statistics
import sys

from scipy.stats import mannwhitneyu

FIELDS = ("seconds", "ratio_vs_iperf3_bidir_sum", "server_cpu_s_per_gb", "server_minor_faults_per_gb",
          "cpu_s_per_gb")

rows = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in rows if r["system"].startswith("ps-")]
trees = {tree: [r for r in rows if r["tree"] == tree] for tree in ("old", "new")}
print("runs: " + ", ".join(f"{tree} {len(rs)}" for tree, rs in trees.items()))
for name in FIELDS:
    old, new = ([r[name] for r in trees[t]] for t in ("old", "new"))
    p = mannwhitneyu(old, new, alternative="two-sided").pvalue
    print(f"{name:28s} old {statistics.median(old):12.4f}  new {statistics.median(new):12.4f}  "
          f"new/old {statistics.median(new) / statistics.median(old):6.3f}  p {p:.3f}")
    print(f"{'':28s} old {[round(v, 4) for v in old]}\n{'':28s} new {[round(v, 4) for v in new]}")
