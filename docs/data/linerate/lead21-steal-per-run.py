"""Steal per run of the issue's rows against the run's misses (twenty-first session): for each run given,
the CPU seconds the hypervisor took during the timed collectives of every system (geryon, gloo, plain
TCP), the largest in one collective, and the rows that missed a target.

    python docs/data/linerate/lead21-steal-per-run.py docs/data/linerate/lead2{0,1}-allreduce-100mbit-*.jsonl
"""
import json
import pathlib
import sys

KEYS = ("steal_all_seconds", "gloo_steal_all_seconds", "wire_ring_steal_all_seconds")
print("run                                      steal s   largest in one collective   rows missed")
for path in sys.argv[1:]:
    records = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    if not all(key in r for r in records for key in KEYS):
        continue                       # a run from before the steal fields
    steal = [s for r in records for key in KEYS for s in r[key]]
    missed = [f"{r['workers']} x {r['size_bytes'] / 1e6:.0f} MB" for r in records
              if r["ratio_vs_gloo"] > 1.0 or r["ratio_vs_line_rate"] > 1.05]
    print(f"{pathlib.Path(path).stem:<40} {sum(steal):7.2f}   {max(steal):7.2f}                     "
          f"{', '.join(missed) or '-'}")
