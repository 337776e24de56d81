"""Summarise lead22-wake-first-byte.py records: per label (a file's `tree` field, else its system),
the median over collectives of the collective's seconds, of the ranks' median and latest first
byte and of their median wake (ms after the common start); then one-sided Mann-Whitney tests of
the second label against the first.

    python docs/data/linerate/lead22-wake-summary.py FILE.jsonl [FIELD]     (FIELD: tree or system)
"""
import json
import statistics
import sys

from scipy.stats import mannwhitneyu

rows = [json.loads(line) for line in open(sys.argv[1])]
field = sys.argv[2] if len(sys.argv) > 2 else "system"
labels = list(dict.fromkeys(r[field] for r in rows))
measures = {"seconds": lambda r: r["seconds"], "first byte latest": lambda r: max(r["first"]),
            "first byte median": lambda r: statistics.median(r["first"]),
            "wake median": lambda r: statistics.median(r["woke"])}
per = {label: {name: [f(r) for r in rows if r[field] == label] for name, f in measures.items()} for label in labels}
for label in labels:
    values = per[label]
    print(f"{label:8s} {len(values['seconds']):3d} collectives  median: {statistics.median(values['seconds']):.4f} s,"
          + ",".join(f" {name} {statistics.median(v):.2f} ms" for name, v in values.items() if name != "seconds"))
if len(labels) == 2:
    a, b = labels
    for name in measures:
        p = mannwhitneyu(per[b][name], per[a][name], alternative="less").pvalue
        print(f"{b} < {a} in {name}: one-sided Mann-Whitney p = {p:.2g}")
