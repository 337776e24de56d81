"""`geryon analyze TRACE.json [TRACE2.json ...] [--out DIR] [--json]`: timeline analytics.

Prints per trace the iteration metrics of geryon/analyze/metrics.py; with --out also writes
<name>-occupancy.png per trace and urgent-wait.png comparing the traces (label = file stem).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path


def add_commands(commands, bench) -> None:
    parser = commands.add_parser("analyze", help="iteration metrics of a geryon timeline trace")
    parser.add_argument("traces", nargs="+", type=Path, help="Chrome-trace JSON files (--timeline)")
    parser.add_argument("--out", type=Path, help="write plots here")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from geryon.analyze.metrics import analyze, summary
    from geryon.analyze.trace import load_trace

    analyses = {}
    for path in args.traces:
        label = path.name.removesuffix(".json")
        analyses[label] = analyze(load_trace(path))
        if args.json:
            a = analyses[label]
            print(json.dumps({"trace": str(path), "rounds": [asdict(r) for r in a.rounds],
                              "tensors": [asdict(t) for t in a.tensors],
                              "waits": {str(c): w for c, w in a.waits.items()}}))
        else:
            print(summary(analyses[label], label))
    if args.out:
        from geryon.analyze.plots import occupancy_plot, wait_plot
        args.out.mkdir(parents=True, exist_ok=True)
        for label, a in analyses.items():
            if a.occupancy:
                occupancy_plot(a, args.out / f"{label}-occupancy.png", f"{label}: frames on the wire per class")
        wait_plot(analyses, args.out / "urgent-wait.png")
        print(f"wrote plots to {args.out}")
    return 0
