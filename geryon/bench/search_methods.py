"""Search methods compared on the analytic model over many seeds: `python -m geryon.bench.search_methods`.

Each case is a model at a per-worker bandwidth with multiplicative lognormal noise per iteration and
5% of iterations 3x slower (`geryon.bench.sweep.analytic_measure`); each method runs the same budget
on the same seeds; the error of a run is the noise-free time at the chosen threshold over the
noise-free best candidate (`true_ratio`). Prints one row per (case, noise, method): mean error,
95th percentile, worst, and the share of runs beyond 3%.

    python -m geryon.bench.search_methods [--seeds 40] [--noise 0.02,0.05] [--json]
    python -m geryon.bench.search_methods --replay RUN.json [RUN.json ...]

`--replay` evaluates the methods on measured curves instead: each RUN.json of an emulated
`geryon bench threshold` holds every candidate's iterations from its (multi-pass) sweep; a replayed
search draws each iteration of a probe at random from that candidate's measured kept iterations
(warm-up iterations from its measured warm-ups), so the measured noise -- heavy tails, load bursts
from elsewhere on the machine -- is the noise model. The error is then the chosen candidate's sweep
median over the sweep's best median (the yardstick of the bench's `sweep_ratio`).

`--replay RUN.json --criterion 8x2,12x2` bootstraps the whole done-criterion instead, for each
"iterations per probe x sweep passes": the default search with probes of that length, then a fresh
sweep of that many passes drawn from the same measured iterations, and the bench's `sweep_ratio`
(chosen over best, both in that sweep). It also reports `yardstick`: the same ratio for the
recorded sweep's best candidate, i.e. how often the sweep itself would fail its own best -- the
part of a miss that no search can remove.
"""

import argparse
import json
import sys
import time

import numpy as np

from geryon.bench.sweep import analytic_measure
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.search import SearchSettings, ThresholdSearch

CASES = (("vgg19", 20e9), ("resnet50", 10e9), ("vgg19", 40e9), ("resnet50", 5e9), ("inception3", 5e9))
METHODS = {
    "fit (old: 6 + 4 refining)": dict(method="fit", confirm=0),
    "fit + re-measure top two": dict(method="fit", confirm=2),
    "gp (6 + 4 refining)": dict(method="gp", confirm=0),
    "gp + re-measure top two": dict(method="gp", confirm=2),
    "fit, fastest 2/3": dict(method="fit", confirm=0, fastest=2 / 3),
    "fit + re-measure, fastest 2/3": dict(method="fit", confirm=2, fastest=2 / 3),
    "gp + re-measure, fastest 2/3": dict(method="gp", confirm=2, fastest=2 / 3),
}


def evaluate(model: str, bandwidth: float, noise: float, overrides: dict, seeds: int,
             iters_per_probe: int = 5, warmup: int = 1, bursts: float = 0.0) -> list[float]:
    profile = resolve_profile(model)
    ratios = []
    for seed in range(seeds):
        measure, truth = analytic_measure(profile, bandwidth, noise=noise, outlier_rate=0.05, seed=seed,
                                          burst_rate=bursts)
        settings = SearchSettings(iters_per_probe=iters_per_probe, warmup=warmup, **overrides)
        search = ThresholdSearch(settings)
        chosen = search.run(measure)
        best = min(truth(t) for t in settings.candidates)
        ratios.append(truth(chosen) / best)
    return ratios


def replayed_measure(record: dict, seed: int):
    """(measure_iteration, truth) drawing iterations from a recorded sweep (see the module docstring)."""
    settings = record["settings"]
    warmup, length = settings["warmup"], settings["iters_per_probe"]
    kept, warm = {}, {}
    for point in record["sweep"]:
        times = point["times"]
        kept[point["threshold"]] = [t for s in range(0, len(times), length) for t in times[s + warmup:s + length]]
        warm[point["threshold"]] = [t for s in range(0, len(times), length) for t in times[s:s + warmup]]
    truth = {p["threshold"]: p["iter_s"] for p in record["sweep"]}
    rng = np.random.default_rng(seed)
    state = {"threshold": None, "count": 0}

    def measure(threshold: float) -> float:
        if threshold != state["threshold"]:
            state.update(threshold=threshold, count=0)
        state["count"] += 1
        pool = warm[threshold] if state["count"] <= warmup and warm[threshold] else kept[threshold]
        return float(pool[rng.integers(len(pool))])

    return measure, truth


def evaluate_replay(record: dict, overrides: dict, seeds: int) -> list[float]:
    settings_data = record["settings"]
    ratios = []
    for seed in range(seeds):
        measure, truth = replayed_measure(record, seed)
        settings = SearchSettings(iters_per_probe=settings_data["iters_per_probe"], warmup=settings_data["warmup"],
                                  candidates=tuple(truth), **overrides)
        chosen = ThresholdSearch(settings).run(measure)
        ratios.append(truth[chosen] / min(truth.values()))
    return ratios


def evaluate_criterion(record: dict, iters_per_probe: int, sweep_passes: int,
                       seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """(sweep_ratio of the search's choice, sweep_ratio of the recorded best) per seed; see above."""
    from geryon.bench.sweep import run_threshold_bench

    warmup = record["settings"]["warmup"]
    ratios, yardstick = [], []
    for seed in range(seeds):
        measure, truth = replayed_measure(record, seed)
        settings = SearchSettings(iters_per_probe=iters_per_probe, warmup=warmup, candidates=tuple(truth))
        result = run_threshold_bench(measure, settings, sweep=True, sweep_passes=sweep_passes, seed=seed)
        ratios.append(result["extra"]["sweep_ratio"])
        swept = {p["threshold"]: p["iter_s"] for p in result["sweep"]}
        yardstick.append(swept[min(truth, key=lambda t: (truth[t], t))] / min(swept.values()))
    return np.array(ratios), np.array(yardstick)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geryon.bench.search_methods")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--noise", default="0.02,0.05")
    parser.add_argument("--cases", default=",".join(f"{m}@{b / 1e9:g}" for m, b in CASES),
                        help="model@Gbit/s per worker, comma-separated")
    parser.add_argument("--methods", default=",".join(str(i) for i in range(len(METHODS))))
    parser.add_argument("--bursts", type=float, default=0.0,
                        help="per-iteration chance that a burst of 4 iterations 25%% slower starts")
    parser.add_argument("--iters-per-probe", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--replay", nargs="*", help="RUN.json files of emulated benches (see above)")
    parser.add_argument("--criterion", default=None,
                        help="with --replay: bootstrap the done-criterion for these 'iterations per probe x "
                             "sweep passes', e.g. 8x2,12x2")
    parser.add_argument("--table", nargs="*", help="emulated RUN.json files: print the done-criterion table "
                                                    "(one markdown row per run)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        return _main_table(args.table)
    if args.replay:
        return _main_replay(args)
    cases = [(c.split("@")[0], float(c.split("@")[1]) * 1e9) for c in args.cases.split(",")]
    names = [list(METHODS)[int(i)] for i in args.methods.split(",")]
    rows = []
    for model, bandwidth in cases:
        for noise in (float(n) for n in args.noise.split(",")):
            for name in names:
                started = time.perf_counter()
                ratios = np.array(evaluate(model, bandwidth, noise, METHODS[name], args.seeds,
                                           args.iters_per_probe, args.warmup, args.bursts))
                row = {"model": model, "gbps": bandwidth / 1e9, "noise": noise, "bursts": args.bursts, "method": name,
                       "mean_pct": 100 * (ratios.mean() - 1), "p95_pct": 100 * (np.percentile(ratios, 95) - 1),
                       "worst_pct": 100 * (ratios.max() - 1), "beyond_3pct": float((ratios > 1.03).mean()),
                       "seconds": time.perf_counter() - started}
                rows.append(row)
                if not args.json:
                    print(f"{model:10s} {bandwidth / 1e9:4g}G noise {noise:.2f} bursts {args.bursts:.2f} {name:28s} "
                          f"mean {row['mean_pct']:5.2f}% "
                          f"p95 {row['p95_pct']:5.2f}% worst {row['worst_pct']:5.2f}% >3%: "
                          f"{100 * row['beyond_3pct']:4.0f}%  ({row['seconds']:.0f} s)", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


def criterion_row(record: dict) -> dict:
    """One emulated run's done-criterion figures (see docs/threshold-search.md)."""
    extra, settings = record["extra"], record["settings"]
    switches = extra.get("switches") or []
    loads = [s["loadavg"] for s in switches if s.get("loadavg") is not None]
    return {"model": record["context"].get("model"), "chosen": record["chosen"], "sweep_best": extra.get("sweep_best"),
            "sweep_ratio": extra.get("sweep_ratio"), "iteration_noise": extra.get("iteration_noise"),
            "probes": extra.get("probes"), "iters_per_probe": settings["iters_per_probe"],
            "sweep_passes": extra.get("sweep_passes"), "run_wait_share": extra.get("run_wait_share"),
            "loadavg_median": float(np.median(loads)) if loads else None, "wall_s": extra.get("wall_s")}


def _main_table(paths) -> int:
    from geryon.categorize.runrecord import load_run

    def fmt(value, spec):
        return "" if value is None else format(value, spec)

    def pct(value, spec):
        return "" if value is None else format(100 * value, spec) + "%"

    print("| run | model | chosen | sweep best | sweep_ratio | noise | probes (iterations) | run-queue wait "
          "| load avg | time |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in paths:
        row = criterion_row(load_run(path))
        within = "" if row["sweep_ratio"] is None else (" within" if row["sweep_ratio"] <= 1.03 else " **miss**")
        print(f"| {path} | {row['model']} | {row['chosen']:g} | {fmt(row['sweep_best'], 'g')} | "
              f"{fmt(row['sweep_ratio'], '.3f')}{within} | {pct(row['iteration_noise'], '.1f')} | "
              f"{row['probes']} ({row['iters_per_probe']}) | "
              f"{pct(row['run_wait_share'], '.0f')} | "
              f"{fmt(row['loadavg_median'], '.1f')} | {fmt(row['wall_s'], '.0f')} s |")
    return 0


def _main_replay(args) -> int:
    from geryon.categorize.runrecord import load_run

    names = [list(METHODS)[int(i)] for i in args.methods.split(",")]
    rows = []
    for path in args.replay:
        record = load_run(path)
        for shape in (args.criterion.split(",") if args.criterion else []):
            length, passes = (int(x) for x in shape.lower().split("x"))
            ratios, yardstick = evaluate_criterion(record, length, passes, args.seeds)
            within = float((ratios <= 1.03).mean())
            row = {"run": path, "model": record["context"].get("model"), "iters_per_probe": length,
                   "sweep_passes": passes, "mean_sweep_ratio": float(ratios.mean()), "within_3pct": within,
                   "three_of_three": within ** 3, "yardstick_beyond_3pct": float((yardstick > 1.03).mean())}
            rows.append(row)
            if not args.json:
                print(f"{path}: {row['model']:9s} {length:2d} iterations x {passes} passes: sweep_ratio mean "
                      f"{row['mean_sweep_ratio']:.3f}, within 3% {100 * within:3.0f}%, 3 of 3 "
                      f"{100 * row['three_of_three']:3.0f}%; the recorded best misses its own sweep "
                      f"{100 * row['yardstick_beyond_3pct']:3.0f}%", flush=True)
        for name in (names if not args.criterion else []):
            ratios = np.array(evaluate_replay(record, METHODS[name], args.seeds))
            row = {"run": path, "model": record["context"].get("model"), "method": name,
                   "mean_pct": 100 * (ratios.mean() - 1), "p95_pct": 100 * (np.percentile(ratios, 95) - 1),
                   "worst_pct": 100 * (ratios.max() - 1), "beyond_3pct": float((ratios > 1.03).mean())}
            rows.append(row)
            if not args.json:
                print(f"{path}: {row['model']:9s} {name:28s} mean {row['mean_pct']:5.2f}% p95 {row['p95_pct']:5.2f}% "
                      f"worst {row['worst_pct']:5.2f}% >3%: {100 * row['beyond_3pct']:4.0f}%", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
