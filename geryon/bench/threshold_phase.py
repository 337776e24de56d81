"""Why a replayed PS job's iterations vary: one threshold, many iterations, every worker's timing.

    python -m geryon.bench.threshold_phase --model resnet50 --workers 4 --threshold 0.7 \\
        --iterations 150 [--congestion cubic] --out phase.json

Runs the bench's emulated cluster (`geryon.bench.threshold.default_setup`) at one threshold and
records, per iteration, the driver's send and receive times and each worker's start, seconds and
time blocked on pulls; prints `summarize`: the iteration time's spread, the share of compute-only
iterations (no worker blocked long enough to matter: under `fast_s`), how the workers' end times
spread, and the correlation of that spread with the next iteration's time -- the evidence in
docs/threshold-search.md for where ResNet-50's two kinds of iterations come from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict


def measure(model: str, workers: int, threshold: float, iterations: int, congestion: str = "",
            free_running: bool = False) -> dict:
    """Run `iterations` steps at `threshold`; every step's driver and worker timestamps.

    free_running: the workers run all their iterations back to back (`run`), without the
    driver's barrier between iterations, as in training; rows then have no driver times."""
    from geryon.bench.threshold import ReplayedPSJob, gather_replies, cluster_name, default_setup
    from geryon.categorize.profiles import resolve_profile
    from geryon.emulate import EmulatedCluster
    from geryon.signals import sigterm_as_interrupt

    setup = default_setup(model, workers=workers, congestion=congestion)
    profile = resolve_profile(setup.model, batch=setup.batch)
    rows = []
    with sigterm_as_interrupt(), EmulatedCluster(cluster_name(), hosts=setup.servers + setup.workers,
                                                 bw=setup.link_rate, priority=True) as cluster:
        job = ReplayedPSJob(cluster, setup, profile.ranking())
        try:
            job.start()
            job.switch(threshold)
            if free_running:
                runs = gather_replies(job.workers, "run", iterations=iterations)
                for index in range(iterations):
                    rows.append({"workers": [{key: run["steps"][index].get(key)
                                              for key in ("start", "seconds", "blocked_s")} for run in runs]})
                job.iterations += iterations
            for _ in range(0 if free_running else iterations):
                sent = time.time()
                replies = gather_replies(job.workers, "step")
                rows.append({"sent": sent, "received": time.time(),
                             "workers": [{key: reply.get(key) for key in ("start", "seconds", "blocked_s")}
                                         for reply in replies]})
                job.iterations += 1
            job.finish()
        finally:
            job.stop()
    return {"setup": asdict(setup), "threshold": threshold, "free_running": free_running, "rows": rows}


def summarize(data: dict, skip: int = 3, fast_s: float | None = None) -> dict:
    """The iteration time's spread and what predicts it (the first `skip` iterations left out)."""
    import numpy as np

    rows = data["rows"]
    slowest = np.array([max(w["seconds"] for w in row["workers"]) for row in rows])
    if data.get("free_running"):
        # no barrier: an iteration lasts from one start to the next (the period), as rank 0 logs it
        period = np.diff(np.array([row["workers"][0]["start"] for row in rows]))
        slowest = np.append(period, period[-1:]) if len(period) else slowest
    ends = np.array([[w["start"] + w["seconds"] for w in row["workers"]] for row in rows])
    starts = np.array([[w["start"] for w in row["workers"]] for row in rows])
    blocked = np.array([[w["blocked_s"] for w in row["workers"]] for row in rows])
    spread = ends.max(1) - ends.min(1)
    kept = slowest[skip:]
    seconds = np.array([[w["seconds"] for w in row["workers"]] for row in rows])
    compute = float(np.median((seconds - blocked).max(1)[skip:]))   # replayed compute, no waiting
    fast_s = fast_s if fast_s is not None else compute * 1.2
    gaps = starts[1:].min(1) - ends[:-1].max(1)
    return {"iterations": len(kept), "mean_s": float(kept.mean()), "median_s": float(np.median(kept)),
            "cv": float(kept.std() / kept.mean()), "compute_s": compute,
            "compute_only_share": float(np.mean(kept < fast_s)), "fast_s": fast_s,
            "driver_gap_s": float(np.median(gaps[skip:])), "end_spread_s": float(np.median(spread[skip:])),
            "corr_end_spread_next_iteration": float(np.corrcoef(spread[skip:-1], slowest[skip + 1:])[0, 1]),
            "corr_iteration_next_iteration": float(np.corrcoef(kept[:-1], kept[1:])[0, 1]),
            "blocked_s_median": float(np.median(blocked.max(1)[skip:]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geryon.bench.threshold_phase")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--congestion", default="", help="TCP congestion control (default: the system's)")
    parser.add_argument("--free-running", action="store_true",
                        help="workers run back to back, no driver barrier between iterations")
    parser.add_argument("--out", help="write every step's timing here (JSON)")
    parser.add_argument("--summarize", metavar="JSON", help="only summarize a file written by --out")
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as handle:
            data = json.load(handle)
    else:
        data = measure(args.model, args.workers, args.threshold, args.iterations, args.congestion,
                       args.free_running)
        if args.out:
            with open(args.out, "w") as handle:
                json.dump(data, handle)
    print(json.dumps(summarize(data), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
