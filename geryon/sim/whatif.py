"""What-if sweeps behind docs/simulator.md: network priority (geryon) over endhost as the cluster,
the bandwidth and the oversubscription grow, and K = 4 against K = 2 classes.

    python -m geryon.sim.whatif --out docs/sim --compute-scale 10.146
    python -m geryon.sim.whatif --out docs/sim-pullahead --compute-scale 10.146 --pull ahead \
        --sweeps workers,bandwidth

Writes whatif.json (every simulated point) and one PNG per sweep. Each point: iteration time of
endhost, geryon (K = 2) and geryon (K = 4); the ratio endhost / geryon > 1 means priority in the
network pays. Aggregate model, colocated layout, 3 iterations after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from geryon.sim.report import line_chart
from geryon.sim.scenario import SimSetting, simulate

MODELS = ("vgg19", "resnet50", "inceptionv3", "alexnet")
WORKERS = (8, 32, 128, 512, 1024)
GBIT = (1, 5, 10, 40, 100, 400)
OVERSUB = (1, 2, 4, 8)


def point(setting: SimSetting) -> dict:
    endhost = simulate(setting, "endhost")["iteration_s"]
    geryon = simulate(setting, "geryon")["iteration_s"]
    k4 = simulate(replace(setting, classes=4), "geryon")["iteration_s"]
    return {"model": setting.model, "workers": setting.workers, "bw_gbit": setting.bw_bps / 1e9,
            "oversubscription": setting.oversubscription, "topology": setting.topology,
            "endhost_s": endhost, "geryon_s": geryon, "geryon_k4_s": k4,
            "gain": endhost / geryon, "gain_k4": endhost / k4,
            "efficiency_geryon": simulate(setting, "geryon")["compute_s"] / geryon}


SWEEPS = ("workers", "bandwidth", "oversubscription")


def sweeps(scale: float, slice_params: int, iterations: int, pull_ahead: bool = False,
           only: tuple[str, ...] = SWEEPS):
    base = SimSetting(compute_scale=scale, iterations=iterations, slice_params=slice_params,
                      pull_ahead=pull_ahead)
    for model in MODELS:
        if "workers" in only:
            for workers in WORKERS:
                yield "workers", point(replace(base, model=model, workers=workers))
        if "bandwidth" in only:
            for gbit in GBIT:
                yield "bandwidth", point(replace(base, model=model, link=None, bw_bps=gbit * 1e9))
        if "oversubscription" in only:
            for ratio in OVERSUB:
                yield "oversubscription", point(replace(base, model=model, workers=64, topology="leafspine",
                                                        oversubscription=ratio, hosts_per_leaf=16))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compute-scale", type=float, default=10.146)
    parser.add_argument("--slice-params", type=int, default=256 * 1024)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--pull", choices=("end", "ahead"), default="end",
                        help="when workers ask for the next parameters (see geryon sim --pull)")
    parser.add_argument("--sweeps", default=",".join(SWEEPS), help=f"comma-separated: {', '.join(SWEEPS)}")
    args = parser.parse_args(argv)
    only = tuple(s.strip() for s in args.sweeps.split(",") if s.strip())
    if not only or set(only) - set(SWEEPS):
        parser.error(f"--sweeps: choose from {', '.join(SWEEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    points: dict[str, list] = {}
    started = time.perf_counter()
    for sweep, row in sweeps(args.compute_scale, args.slice_params, args.iterations,
                             args.pull == "ahead", only):
        points.setdefault(sweep, []).append(row)
        print(sweep, json.dumps(row), flush=True)
    (args.out / "whatif.json").write_text(json.dumps(points, indent=1) + "\n")
    axes = {"workers": ("workers", True), "bandwidth": ("bw_gbit", True),
            "oversubscription": ("oversubscription", False)}
    for sweep, (key, logx) in axes.items():
        if sweep not in points:
            continue
        series = {}
        for model in MODELS:
            rows = [r for r in points[sweep] if r["model"] == model]
            series[f"{model} K=2"] = ([r[key] for r in rows], [r["gain"] for r in rows])
        line_chart(series, args.out / f"gain_vs_{sweep}.png",
                   f"endhost / geryon iteration time vs {sweep} (>1: network priority pays)",
                   key, "gain over endhost", logx=logx)
        k4 = {f"{m}": ([r[key] for r in points[sweep] if r["model"] == m],
                       [r["gain_k4"] / r["gain"] for r in points[sweep] if r["model"] == m])
              for m in MODELS}
        line_chart(k4, args.out / f"k4_vs_k2_{sweep}.png", f"K=4 over K=2 (geryon) vs {sweep}",
                   key, "speedup of K=4 over K=2", logx=logx)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
