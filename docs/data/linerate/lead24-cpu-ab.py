"""CPU per GB before and after numpy reduces received slices (twenty-fourth session).

Reads lead24-cpu-ab-4x100mb.jsonl: `geryon bench allreduce --workers 4 --sizes 1e8 --repeat 3 --bw 100mbit
--congestion reno --no-wire-ring --json`, run six times from each tree, alternated (tree "old": d8655f8,
torch reduces every slice; tree "new": 7b57291, numpy). Prints each tree's runs, medians, geryon's figure
over gloo's in the same run (which takes out how busy the machine was), and a two-sided Mann-Whitney test.

    python docs/data/linerate/lead24-cpu-ab.py

The twenty-fifth session's A/B uses it too, naming its file and the figures to compare (tree "old":
b69ea80; "new": the trim of the receive path's Python, not kept), see lead25-commands.txt, and so does
the twenty-sixth's (lead26-cpu-ab-4x100mb.jsonl; "old": a157914, "new": the idle header wait in poll):

    python docs/data/linerate/lead24-cpu-ab.py lead25-cpu-ab-4x100mb.jsonl seconds cpu_s_per_gb \
        user_cpu_s_per_gb context_switches_per_gb machine_cpu_s_per_gb
"""
import json
import pathlib
import statistics
import sys

from scipy.stats import mannwhitneyu

HERE = pathlib.Path(__file__).parent
FILE = sys.argv[1] if len(sys.argv) > 1 else "lead24-cpu-ab-4x100mb.jsonl"
records = [json.loads(line) for line in (HERE / FILE).read_text().splitlines()]
KEYS = tuple(sys.argv[2:]) or ("seconds", "cpu_s_per_gb", "machine_cpu_s_per_gb")
by_tree = {tree: [r for r in records if r["tree"] == tree] for tree in ("old", "new")}
values = {}
for tree, runs in by_tree.items():
    for key in KEYS:
        ours = [r[key] for r in runs]
        gloo = [r[f"gloo_{key}"] for r in runs]
        over_gloo = [a / b for a, b in zip(ours, gloo)]
        values[tree, key] = ours
        values[tree, f"{key} / gloo"] = over_gloo
        print(f"{tree} {key:<22} median {statistics.median(ours):.3f} (gloo {statistics.median(gloo):.3f}),"
              f" over gloo {statistics.median(over_gloo):.3f}; runs {' '.join(f'{v:.3f}' for v in ours)}")
for key in [k for k in KEYS if k != "seconds"] + [f"{k} / gloo" for k in KEYS if k != "seconds"]:
    old, new = values["old", key], values["new", key]
    change = statistics.median(new) / statistics.median(old) - 1
    p = mannwhitneyu(new, old, alternative="two-sided").pvalue
    print(f"{key:<29} new / old median {change:+.1%}, Mann-Whitney two-sided p = {p:.3f}"
          f" ({len(new)} vs {len(old)} runs)")
