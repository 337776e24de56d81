"""How the exact model's error against emulated records moves with TCP short-term unfairness
(sixteenth session): each busy period of a connection draws a log-normal(0, sigma) share weight
(geryon.sim.job). Per record and sigma, the mean simulated iteration over SEEDS seeds against the
measured one, per policy. The weighted sharing was tried and not
kept (it breaks the VGG-19 validation, docs/simulator.md); its code is `unfairness.patch` here.
Usage, from the repository root, on a scratch checkout of the code it was tried on:

    git apply docs/data/simval-sixteenth/unfairness.patch
    python docs/data/simval-sixteenth/unfairness_sweep.py SIGMA[,SIGMA...] SEEDS RECORD.json [...]

Output: unfairness-sweep.jsonl (the 8-worker VGG-19 sweep at sigma 1.0 was stopped unfinished).
"""
import json
import sys
from dataclasses import replace

from geryon.sim.compare import compare, load_rows
from geryon.sim.scenario import SimSetting

sigmas = [float(s) for s in sys.argv[1].split(",")]
seeds = int(sys.argv[2])
for path in sys.argv[3:]:
    rows = load_rows(path)
    for sigma in sigmas:
        errors: dict = {}
        for seed in range(seeds if sigma else 1):
            results, _ = compare(rows, replace(SimSetting(), unfairness=sigma, seed=seed))
            for r in results:
                errors.setdefault((r["link"], r["policy"]), []).append((r["simulated_s"], r["measured_s"]))
        cells = {f"{link} {policy}": sum(s for s, _ in v) / len(v) / v[0][1] - 1
                 for (link, policy), v in errors.items()}
        print(json.dumps({"record": path, "sigma": sigma, "seeds": seeds if sigma else 1,
                          "error": {k: round(e, 4) for k, e in cells.items()}}), flush=True)
