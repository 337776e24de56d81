"""`geryon bench ...`: every benchmark's command line; each prints a ratio against a baseline measured in
the same run.

    geryon bench threshold --model M [--workers N] [--bandwidth 10gbit] [--json] [--out RUN.json]
                           [--backend analytic|emulated] [--servers M] [--size-scale S] [--time-scale A]
        search vs exhaustive sweep of the same candidates. "analytic": the iteration-time model with
        noise (geryon.bench.sweep). "emulated" (root): replayed workers and parameter servers over the
        real transport on an emulated cluster (geryon.bench.threshold; ports at bandwidth * size_scale /
        time_scale); writes RUN.json (default ./RUN.json) for `geryon report threshold`. `--json` names
        the backend that measured.
    geryon bench transport | allreduce | priority
        the transport against iperf3, against gloo, and an urgent burst under bulk (geryon.bench.transport)
    geryon bench paper --model vgg19 [--link 10gbe|40gbe] [--json] [--out DIR]
        the paper's scaling table on replayed models (geryon.bench.paper; its options in paper_cli)
    geryon bench pull [--bw 400mbit] [--workers 2] [--width 64] [--repeat 3] [--json]
        a real training script in PS mode, --ps-pull end vs ahead, same loss checked (geryon.bench.pull)
    geryon bench diff A.json B.json [--keys F,F,...] [--json]
        two records of one bench compared row by row: medians, B/A, Mann-Whitney p (geryon.bench.diff)
"""

import json
import os
import sys

from geryon.bench import transport
from geryon.errors import ConfigError


def add_commands(commands, bench) -> None:
    from geryon.bench import diff, paper_cli, pull

    paper_cli.add_commands(commands, bench)
    pull.add_command(bench)
    diff.add_command(bench)
    bench_threshold = bench.add_parser("threshold", help="threshold search vs exhaustive sweep")
    bench_threshold.add_argument("--model", default="vgg19", help="profile name (default vgg19)")
    bench_threshold.add_argument("--workers", type=int, default=1,
                                 help="workers sharing the parameter server's link (analytic: bandwidth / N)")
    bench_threshold.add_argument("--backend", choices=("analytic", "emulated"), default=None,
                                 help="emulated (root; the default as root): replayed models over the real "
                                      "transport on an emulated cluster; analytic (the default otherwise): "
                                      "the iteration-time model with noise")
    bench_threshold.add_argument("--servers", type=int, default=1, help="parameter servers (emulated)")
    bench_threshold.add_argument("--size-scale", type=float, default=0.01,
                                 help="emulated: tensor sizes x this, port rate scaled to match")
    bench_threshold.add_argument("--time-scale", type=float, default=None,
                                 help="emulated: compute times x this, port rate scaled to match "
                                      "(default per model: vgg19 1, resnet50 2)")
    bench_threshold.add_argument("--within-class", choices=("fifo", "urgency"), default="fifo",
                                 help="emulated: send order inside a class (fifo: the paper's Geryon, only "
                                      "the network reorders; urgency: end-host urgency queues as well)")
    bench_threshold.add_argument("--congestion", default="",
                                 help="emulated: TCP congestion control, e.g. cubic (default: the system's)")
    bench_threshold.add_argument("--spin-margin", type=float, default=None,
                                 help="emulated: busy-wait per replayed layer in seconds (default 1 ms; "
                                      "resnet50 0.2 ms: its ~1 ms layers would spin throughout)")
    bench_threshold.add_argument("--cluster-name", help="emulated: name of the cluster (default random)")
    bench_threshold.add_argument("--candidates", help="comma-separated thresholds (default 0, 0.05, ..., 1)")
    bench_threshold.add_argument("--bandwidth", default=None,
                                 help="paper-scale link rate (analytic default 40gbit; emulated default per "
                                      "model: 20 Gbit/s per worker for vgg19, 10 for resnet50, times "
                                      "workers / servers)")
    bench_threshold.add_argument("--noise", type=float, default=0.02, help="lognormal sigma per iteration")
    bench_threshold.add_argument("--outlier-rate", type=float, default=0.05,
                                 help="share of iterations made 3x slower")
    bench_threshold.add_argument("--seed", type=int, default=0)
    bench_threshold.add_argument("--metric", choices=("position", "bytes"), default="position")
    bench_threshold.add_argument("--budget", type=int, default=None,
                                 help="probes in all (default 10 for two classes, 6 more per extra class)")
    bench_threshold.add_argument("--classes", type=int, default=2,
                                 help="K: search K-1 thresholds (analytic backend; default 2)")
    bench_threshold.add_argument("--method", choices=("gp", "fit"), default=None,
                                 help="fit: the robust spline (default for two classes); gp: Gaussian "
                                      "process (default for more)")
    bench_threshold.add_argument("--confirm", type=int, default=2,
                                 help="last probes re-measuring the two best, alternating (default 2)")
    bench_threshold.add_argument("--sweep-passes", type=int, default=None,
                                 help="passes over the candidates in the sweep, each in a random order "
                                      "(default 3 emulated, 1 analytic)")
    bench_threshold.add_argument("--race-passes", type=int, default=None,
                                 help="then this many passes over the contenders only (default 10 emulated, "
                                      "0 analytic): the choice and the candidates nearest the best")
    bench_threshold.add_argument("--race-contenders", type=int, default=4,
                                 help="candidates besides the choice kept in the race (default 4)")
    bench_threshold.add_argument("--sweep-statistic", choices=("trimmed", "mean", "median"), default=None,
                                 help="a candidate's time from its iterations (default: trimmed mean with a "
                                      "race, else median)")
    bench_threshold.add_argument("--first-round", type=int, default=6)
    bench_threshold.add_argument("--iters-per-probe", type=int, default=None,
                                 help="iterations per probe (default 5; emulated 12: its iterations vary "
                                      "2-6%% on 2 shared cores, and a 4-iteration burst of load from "
                                      "elsewhere should not decide a probe's median)")
    bench_threshold.add_argument("--warmup", type=int, default=None,
                                 help="iterations discarded at the start of a probe (default 1; emulated 2: "
                                      "the first runs on parameters pulled before the switch, the second "
                                      "is the first transfer on the new connections)")
    bench_threshold.add_argument("--out", help="write the RUN.json record here (a file, or DIR/RUN.json)")
    bench_threshold.add_argument("--json", action="store_true", help="print the comparison as JSON")
    bench_threshold.set_defaults(func=_bench_threshold)
    transport.add_benches(bench)


def _bench_threshold(args) -> int:
    from geryon.bench.sweep import (SweepRace, analytic_measure, coarse_threshold, profile_context,
                                    run_threshold_bench)
    from geryon.categorize.profiles import resolve_profile
    from geryon.categorize.runrecord import write_run
    from geryon.categorize.search import SearchSettings
    from geryon.rates import parse_rate

    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    profile = resolve_profile(args.model)
    candidates = {}
    if args.candidates:
        try:
            candidates["candidates"] = tuple(float(t) for t in args.candidates.split(",") if t.strip())
        except ValueError:
            raise ConfigError(f"--candidates {args.candidates!r}: give comma-separated numbers") from None
    if args.backend is None:
        args.backend = "emulated" if os.geteuid() == 0 else "analytic"
    emulated = args.backend == "emulated"
    if emulated and args.classes != 2:
        raise ConfigError("bench threshold --classes K > 2 runs on the analytic backend; a K-class search "
                          "on the emulated cluster runs in training: python -m geryon.launch --emulate "
                          "--priority search --max-classes K")
    settings = SearchSettings(budget=args.budget, first_round=args.first_round, classes=args.classes,
                              method=args.method, confirm=args.confirm,
                              iters_per_probe=args.iters_per_probe or (12 if emulated else 5),
                              warmup=args.warmup if args.warmup is not None else (2 if emulated else 1),
                              **candidates)
    race_passes = args.race_passes if args.race_passes is not None else (10 if emulated else 0)
    race = SweepRace(contenders=args.race_contenders, passes=race_passes,
                     statistic=args.sweep_statistic or "trimmed") if race_passes > 0 else None
    if race is None and args.sweep_statistic not in (None, "median"):
        raise ConfigError("--sweep-statistic applies to a race: give --race-passes N (N > 0) as well")
    if emulated:
        from geryon.bench.threshold import default_setup, run_emulated_threshold_bench
        setup = default_setup(args.model, workers=args.workers, servers=args.servers,
                              bandwidth=None if args.bandwidth is None else parse_rate(args.bandwidth),
                              time_scale=args.time_scale, size_scale=args.size_scale, metric=args.metric,
                              within_class=args.within_class, congestion=args.congestion,
                              spin_margin=args.spin_margin)
        record = run_emulated_threshold_bench(setup, settings, name=args.cluster_name,
                                              sweep_passes=args.sweep_passes or 3, seed=args.seed, race=race)
        bandwidth = setup.bandwidth * min(1.0, setup.servers / setup.workers)
        written = write_run(args.out or "RUN.json", record)
        print(f"wrote {written} (render it with `geryon report threshold {written}`)", file=sys.stderr)
    else:
        bandwidth = parse_rate(args.bandwidth or "40gbit") / args.workers
        measure, truth = analytic_measure(profile, bandwidth, args.metric, args.noise, args.outlier_rate,
                                          args.seed)
        context = profile_context(profile, args.metric, backend=args.backend, bandwidth_bps=bandwidth,
                                  workers=args.workers, noise=args.noise, seed=args.seed)
        record = run_threshold_bench(measure, settings, context, sweep=True, true_iter_s=truth,
                                     sweep_passes=args.sweep_passes or 1, seed=args.seed, race=race,
                                     references={"coarse": coarse_threshold(profile, args.metric)})
        if args.out:
            write_run(args.out, record)
    extra = record["extra"]
    keys = ("chosen", "chosen_iter_s", "sweep_best", "sweep_best_iter_s", "probes", "ratio",
            "true_ratio", "sweep_ratio", "sweep_fit_ratio", "chosen_sweep_iter_s", "coarse_iter_s",
            "no_priority_iter_s", "iteration_noise", "wall_s", "true_best", "true_two_class_best_iter_s",
            "true_chosen_iter_s", "sweep_ratio_low", "sweep_ratio_high", "sweep_within_share",
            "sweep_contenders")
    result = {"backend": args.backend, **{key: extra[key] for key in keys if key in extra}}
    if "verification" in extra:
        result["updates_verified"] = extra["verification"]["all_ok"]
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.classes != 2:
        print(f"{profile.model} ({args.backend}, {args.classes} classes): search chose t={extra['chosen']} in "
              f"{extra['probes']} probes" + (f"; noise-free {100 * (extra['true_ratio'] - 1):+.1f}% vs the best "
                                             f"pair {extra['true_best']}" if "true_ratio" in extra else ""))
    else:
        print(f"{profile.model} ({args.backend}, {bandwidth / 1e9:g} Gbit/s per worker): search chose "
              f"t={extra['chosen']:g} in {extra['probes']} probes, {extra['chosen_iter_s'] * 1e3:.2f} ms/iter; "
              f"sweep best t={extra['sweep_best']:g}, {extra['sweep_best_iter_s'] * 1e3:.2f} ms/iter "
              f"(ratio {extra['ratio']:.3f}" + (f", in the sweep {extra['sweep_ratio']:.3f}" if "sweep_ratio" in extra
                                                 else "")
              + (f" [{extra['sweep_ratio_low']:.3f}, {extra['sweep_ratio_high']:.3f}] 95%, within 3% in "
                 f"{100 * extra['sweep_within_share']:.0f}% of resamples" if "sweep_ratio_low" in extra else "")
              + ")")
    return 0
