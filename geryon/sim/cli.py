"""`geryon sim`: the flow-level simulator's table, calibration, speedup curve and validation.

    geryon sim [--model vgg19|resnet50|alexnet|inceptionv3|all] [--link 10gbe|40gbe] [--bw GBIT]
               [--workers N] [--layout colocated|separate] [--topology star|leafspine
               --oversubscription R] [--classes K] [--policy P,...] [--iterations N]
               [--slice-params N] [--compute-scale S] [--exact] [--emulated-tcp SIZE_SCALE]
               [--latency-ms MS] [--mtu BYTES] [--json] [--out DIR]
    geryon sim --compare BENCH_PAPER.json      simulated vs measured iteration times
    geryon sim --mode allreduce [--model M] [--link L] [--workers N] [--policy P,...] [--compute-scale S]
    geryon sim --mode allreduce --compare PAPER.json    the ring model vs bench paper --mode allreduce
    geryon sim --curve                         the slides' potential speedup vs bandwidth (VGG-19)
    geryon sim --jobs vgg19,resnet50:allreduce [--workers N] [--bw GBIT] [--oversubscription R]
               [--hosts-per-leaf H] [--size-scale S] [--out DIR]     job mixes on one fabric (sim.jobs)
    geryon sim --jobs --compare TENANTS.json [MORE.json ...] [--cpu-wait]
                                               simulated vs `geryon bench tenants --json` records

Without --compute-scale the ONE compute-time scale is calibrated first (VGG-19, vanilla, 10GbE,
8 colocated workers -> the paper's 26.9%) and printed; every other cell is predicted with it.
`--mode allreduce` runs the ring model (geryon.sim.ring) with that same scale: each policy with DDP's
barrier and with the next forward overlapping the late buckets (+overlap).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from geryon.errors import ConfigError
from geryon.sim.paper import LINKS
from geryon.sim.scenario import (EMULATED_FRAME_BYTES, MAX_WORKERS, MODELS, SimSetting, calibrate, payload_rate,
                                 potential_speedup, simulate)
from geryon.transport.policy import POLICIES

CURVE_GBIT = (1, 2, 5, 10, 20, 40, 100, 200, 400)


def add_commands(commands, bench) -> None:
    parser = commands.add_parser("sim", help="flow-level simulation of PS training under each policy")
    parser.add_argument("--mode", choices=("ps", "allreduce"), default="ps",
                        help="ps (default: the PS flow model) or allreduce (the ring model, geryon.sim.ring)")
    parser.add_argument("--model", default="vgg19", help=f"{', '.join(MODELS)} or all")
    parser.add_argument("--link", default="10gbe", choices=sorted(LINKS), help="paper link (default 10gbe)")
    parser.add_argument("--bw", type=float, help="link rate in Gbit/s, 1-400 (overrides --link)")
    parser.add_argument("--workers", type=int, default=8, help=f"workers, 1-{MAX_WORKERS} (default 8)")
    parser.add_argument("--servers", type=int, help="PS servers (default: one per worker)")
    parser.add_argument("--layout", default="colocated", choices=("colocated", "separate"))
    parser.add_argument("--topology", default="star", choices=("star", "leafspine"))
    parser.add_argument("--oversubscription", type=float, default=1.0, help="leaf-spine, R:1")
    parser.add_argument("--hosts-per-leaf", type=int, help="leaf-spine (default min(16, hosts/2))")
    parser.add_argument("--classes", type=int, default=2, help="network classes for geryon (K)")
    parser.add_argument("--thresholds", help="K-1 comma-separated thresholds (default coarse split)")
    parser.add_argument("--policy", default="all", help="comma-separated policies or all")
    parser.add_argument("--iterations", type=int, default=10, help="measured iterations (+1 warm-up)")
    parser.add_argument("--slice-params", type=int, default=1024 * 1024, help="parameters per slice")
    parser.add_argument("--placement", default="count", choices=("count", "bytes"),
                        help="slices over servers: round-robin (count) or least-bytes")
    parser.add_argument("--compute-scale", type=float, help="skip calibration, use this scale")
    parser.add_argument("--exact", action="store_true", help="per-connection model (<= 64 workers)")
    parser.add_argument("--emulated-tcp", type=float, metavar="SIZE_SCALE",
                        help="add the emulation's TCP effects (bbr port queues measured by "
                             "geryon.sim.queueprobe, 16 KiB NOTSENT_LOWAT plus the bytes in flight it measured, "
                             "an emulated port's framing) at this byte scale, e.g. 0.01")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="per-frame delivery latency")
    parser.add_argument("--mtu", type=int, default=1500,
                        help="IP packet size on the links (default 1500; 9000 for jumbo frames): "
                             "parameters move at the line rate less every packet's headers")
    parser.add_argument("--pull", choices=("end", "ahead"), default="end",
                        help="when a worker asks for the next parameters: after its last push (end, "
                             "default, as bench paper) or with its first (ahead); --compare "
                             "takes each file's own")
    parser.add_argument("--compare", metavar="JSON", nargs="+",
                        help="validate against bench paper rows (with --jobs: against `geryon bench tenants "
                             "--json` records, one or several of the same bench, their repetitions pooled)")
    parser.add_argument("--jobs", nargs="?", const="", metavar="MODEL[:ps|:allreduce],...",
                        help="job mixes on one fabric (geryon.sim.jobs): these jobs, --workers each on shared "
                             "hosts, and a background flow, under vanilla, endhost, fabric, fabric+weights")
    parser.add_argument("--size-scale", type=float, default=1.0, help="--jobs: tensor sizes x this (default 1)")
    parser.add_argument("--background-percent", type=int, default=10,
                        help="--jobs: the background class's guaranteed share (default 10)")
    parser.add_argument("--no-background", action="store_true", help="--jobs: no background flow")
    parser.add_argument("--cpu-wait", action="store_true",
                        help="--jobs --compare: each repetition with the CPU waits it measured per job: per "
                             "wake-up of the replay thread and of a ring step's threads (records from before "
                             "wake-ups were counted: the wait per iteration, spread over the replay's wake-ups)")
    parser.add_argument("--curve", action="store_true", help="potential speedup vs bandwidth (VGG-19)")
    parser.add_argument("--slice-table", action="store_true",
                        help="the paper's slicing table: VGG-19 10GbE, geryon vs endhost, 1024K/512K/256K")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    parser.add_argument("--out", type=Path, help="write rows.json, table.md and PNGs here")
    parser.set_defaults(func=run)


def _setting(args, scale: float) -> SimSetting:
    if args.bw is not None and not 1 <= args.bw <= 400:
        raise ConfigError(f"--bw must be 1-400 Gbit/s, got {args.bw:g}")
    thresholds = tuple(float(t) for t in args.thresholds.split(",")) if args.thresholds else ()
    if args.emulated_tcp is not None and not 0 < args.emulated_tcp <= 1:
        raise ConfigError(f"--emulated-tcp is a byte scale in (0, 1], got {args.emulated_tcp:g}")
    if args.latency_ms < 0:
        raise ConfigError(f"--latency-ms must be >= 0, got {args.latency_ms:g}")
    setting = SimSetting(latency_s=args.latency_ms / 1e3,
                         link=None if args.bw else args.link,
                         bw_bps=args.bw * 1e9 if args.bw else LINKS[args.link], workers=args.workers,
                         servers=args.servers, layout=args.layout, topology=args.topology,
                         oversubscription=args.oversubscription, hosts_per_leaf=args.hosts_per_leaf,
                         classes=args.classes, thresholds=thresholds, slice_params=args.slice_params,
                         placement=args.placement, compute_scale=scale, iterations=args.iterations,
                         exact=args.exact, pull_ahead=args.pull == "ahead", mtu=args.mtu)
    if args.emulated_tcp is None:
        return setting
    from geryon.sim.compare import emulated_tcp   # the same TCP effects as --compare's, for bbr
    fields, _ = emulated_tcp(setting, setting.bw_bps * args.emulated_tcp, args.emulated_tcp)
    return replace(setting, frame_bytes=EMULATED_FRAME_BYTES, **fields)   # and an emulated port's framing


def _say(args, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def run(args) -> int:
    from geryon.sim.report import (add_derived, efficiency_chart, json_lines, line_chart,
                                   markdown_table, text_table)

    if args.jobs is not None:
        from geryon.sim.jobs import run_jobs
        return run_jobs(args)
    models = MODELS if args.model == "all" else tuple(m.strip().lower() for m in args.model.split(","))
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise ConfigError(f"unknown model {bad[0]!r}; choose from {', '.join(MODELS)} or all")
    policies = tuple(POLICIES) if args.policy == "all" else tuple(args.policy.split(","))
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ConfigError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    started = time.perf_counter()
    _setting(args, 1.0)   # validate every flag before any work
    if args.compare:        # each measured row carries its own compute scale: no calibration
        return _compare(args, _setting(args, args.compute_scale or 1.0))
    if args.mode == "allreduce":
        return _ring(args, models, policies)
    if args.compute_scale:
        scale = args.compute_scale
        _say(args, f"compute scale {scale:.4g} (given)")
    else:
        scale = calibrate(_setting(args, 1.0))
        _say(args, f"compute scale {scale:.4g}: calibrated so that VGG-19 vanilla at 10GbE, 8 colocated "
                   "workers, reaches the paper's 26.9% (profile times x scale)")
    base = _setting(args, scale)
    rows = []
    for model in models:
        setting = replace(base, model=model)
        for policy in policies:
            rows.append(simulate(setting, policy))
    add_derived(rows)
    elapsed = time.perf_counter() - started
    if args.json:
        print(json_lines(rows))
    else:
        print(f"{base.describe().split(', ', 1)[1]}; {args.iterations} iterations after 1 warm-up; "
              f"{'exact per-connection' if args.exact else 'aggregate'} model")
        print(text_table(rows))
        print(f"simulated in {elapsed:.1f} s")
    if args.slice_table:
        slice_rows = _slice_table(base)
        if args.json:
            print(json_lines(slice_rows))
        else:
            print("slice params  geryon img/s (paper)  endhost img/s (paper TicTac)")
            for r in slice_rows:
                print(f"{r['slice_params'] // 1024:>8}K    {r['geryon_images_per_s']:7.1f} ({r['paper_geryon']:.1f})"
                      f"       {r['endhost_images_per_s']:7.1f} ({r['paper_tictac']:.1f})")
    curve = _curve(base) if args.curve else None
    if curve and not args.json:
        for gbit, value in zip(*curve):
            print(f"potential speedup VGG-19 at {gbit:>3} Gbit/s: {value:.3f}x")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rows.json").write_text(json_lines(rows) + "\n")
        (args.out / "table.md").write_text(markdown_table(rows) + "\n")
        efficiency_chart(rows, args.out / "efficiency.png",
                         f"simulated scaling efficiency ({base.workers} workers, {base.layout}; "
                         "black: paper)")
        if curve:
            line_chart({"analytic (slides' model)": curve}, args.out / "speedup_vs_bandwidth.png",
                       "VGG-19 potential speedup: pulls in order 1..L vs reverse",
                       "bandwidth (Gbit/s)", "speedup", logx=True)
        _say(args, f"wrote {args.out}/rows.json, table.md, efficiency.png"
                   + (", speedup_vs_bandwidth.png" if curve else ""))
    return 0


def _slice_table(base: SimSetting) -> list[dict]:
    """images/s of geryon and endhost at the paper's three slice sizes (VGG-19, 10GbE, 8 workers)."""
    from geryon.sim.paper import PAPER_SLICING

    setting = replace(base, model="vgg19", link="10gbe", bw_bps=LINKS["10gbe"], workers=8,
                      layout="colocated", topology="star")
    rows = []
    for params, paper in PAPER_SLICING.items():
        cell = replace(setting, slice_params=params)
        rows.append({"table": "slicing", "slice_params": params,
                     "geryon_images_per_s": simulate(cell, "geryon")["images_per_s"],
                     "endhost_images_per_s": simulate(cell, "endhost")["images_per_s"],
                     "paper_geryon": paper["geryon"], "paper_tictac": paper["endhost"]})
    return rows


def _curve(base: SimSetting):
    profile = replace(base, model="vgg19").profile()
    return (list(CURVE_GBIT),
            [potential_speedup(profile, payload_rate(g * 1e9, base.mtu, base.frame_bytes), base.compute_scale)
             for g in CURVE_GBIT])


def _ring(args, models, policies) -> int:
    """The ring model's table: per model and policy, the barrier and the overlapped cell."""
    from geryon.sim.report import json_lines
    from geryon.sim.ring import OVERLAPS, RingSetting, cell_name, simulate_ring

    scale = args.compute_scale or calibrate(_setting(args, 1.0))
    _say(args, f"compute scale {scale:.4g} ({'given' if args.compute_scale else 'calibrated on the PS cell'})")
    rows = []
    for model in models:
        setting = RingSetting(model=model, workers=args.workers, compute_scale=scale, mtu=args.mtu,
                              bw_bps=args.bw * 1e9 if args.bw else LINKS[args.link])
        for policy in policies:
            for overlap in OVERLAPS:
                row = simulate_ring(setting, policy, overlap)
                row["cell"] = cell_name(policy, overlap)
                rows.append(row)
    for row in rows:
        vanilla = next(r for r in rows if r["model"] == row["model"] and r["cell"] == "vanilla") \
            if "vanilla" in policies else None
        row["speedup_vs_vanilla"] = vanilla["iteration_s"] / row["iteration_s"] if vanilla else None
    if args.json:
        print(json_lines(rows))
        return 0
    print(f"ring allreduce, {args.workers} workers, {(args.bw or LINKS[args.link] / 1e9):g} Gbit/s, "
          "DDP's 25 MiB buckets")
    print(f"{'model':<12} {'cell':<16} {'iteration s':>11} {'images/s':>9} {'efficiency':>10} {'vs vanilla':>10}")
    for row in rows:
        speed = "-" if row["speedup_vs_vanilla"] is None else f"x{row['speedup_vs_vanilla']:.2f}"
        print(f"{row['model']:<12} {row['cell']:<16} {row['iteration_s']:>11.3f} {row['images_per_s']:>9.1f} "
              f"{100 * row['scaling_efficiency']:>9.1f}% {speed:>10}")
    return 0


def _compare(args, base: SimSetting) -> int:
    from geryon.sim.compare import compare, load_rows, summary

    if len(args.compare) > 1:
        raise ConfigError("--compare takes one bench paper file (several records: only with --jobs)")
    rows = load_rows(args.compare[0])
    if args.mode == "allreduce":
        from geryon.sim.ring import compare_ring, comparison_table

        results, skipped = compare_ring(rows)
        if args.json:
            from geryon.sim.report import json_lines
            print(json_lines(results))
        else:
            print("ring model (geryon sim --mode allreduce) vs emulated (bench paper --mode allreduce)")
            print(comparison_table(results))
            print(f"{len(results)} rows compared, {skipped} skipped (not an allreduce row)")
        return 0
    results, skipped = compare([r for r in rows if r.get("mode", "ps") == "ps"], base)
    if args.json:
        from geryon.sim.report import json_lines
        print(json_lines(results))
    else:
        print(summary(results))
        print(f"{len(results)} rows compared, {skipped} skipped (no iteration_s or not a policy)")
    return 0
