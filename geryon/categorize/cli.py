"""Commands of the categorizer: `geryon categorize`, `geryon report threshold`, `geryon bench threshold`.

    geryon categorize MODEL [--classes K] [--threshold T[,T...]] [--metric position|bytes] [--json]
        MODEL: a built-in CNN (smallcnn, minivgg, miniresnet), a profile (vgg16, vgg19, resnet50,
        inceptionv3, alexnet -- from $GERYON_PROFILES or ../shared/profiles), or a .dag path.
        Without thresholds: two classes, the coarse CONV/FC split; K > 2 without thresholds: K
        evenly spaced thresholds.
    geryon report threshold RUN.json [--out DIR]
    geryon bench threshold --model M [--workers N] [--bandwidth 10gbit] [--json] [--out RUN.json]
                           [--backend analytic|emulated] [--servers M] [--size-scale S] [--time-scale A]
        search vs exhaustive sweep of the same candidates. "analytic": the iteration-time model with
        noise. "emulated" (root): replayed workers and parameter servers over the real transport on
        an emulated cluster (geryon.bench.threshold; ports at bandwidth * size_scale / time_scale);
        writes RUN.json (default ./RUN.json) for `geryon report threshold`.
"""

import json
import os
import sys

from geryon.errors import ConfigError

DEFAULT_MAX_CLASSES = 8  # HTB offers 8 priorities; pass the transport's count with --max-classes


def add_commands(commands, bench) -> None:
    categorize = commands.add_parser("categorize", help="urgency ranking and priority classes of a model")
    categorize.add_argument("model", help="smallcnn, minivgg, miniresnet, vgg16, vgg19, resnet50, "
                                          "inceptionv3, alexnet, or a .dag profile path")
    categorize.add_argument("--classes", type=int, help="number of classes K (default 2)")
    categorize.add_argument("--threshold", help="K-1 increasing thresholds in [0,1], comma-separated")
    categorize.add_argument("--metric", choices=("position", "bytes"), default="position",
                            help="what a threshold measures along the urgency order (default position)")
    categorize.add_argument("--max-classes", type=int, default=DEFAULT_MAX_CLASSES,
                            help=f"classes the transport has (default {DEFAULT_MAX_CLASSES})")
    categorize.add_argument("--batch", type=int, default=32, help="profile batch size (32 or 64)")
    categorize.add_argument("--json", action="store_true", help="print JSON")
    categorize.set_defaults(func=_categorize)

    report = commands.add_parser("report", help="render results of earlier runs")
    report_sub = report.add_subparsers(dest="report", metavar="REPORT")
    report.set_defaults(func=lambda args: _usage(report))
    threshold = report_sub.add_parser("threshold", help="PNG + Markdown of a threshold search (RUN.json)")
    threshold.add_argument("run", help="RUN.json written by a threshold search")
    threshold.add_argument("--out", help="directory for threshold.png and threshold.md (default: next to RUN.json)")
    threshold.set_defaults(func=_report_threshold)

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
                                 help="emulated: busy-wait per replayed layer in seconds (default 1 ms)")
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
    bench_threshold.add_argument("--first-round", type=int, default=6)
    bench_threshold.add_argument("--iters-per-probe", type=int, default=None,
                                 help="iterations per probe (default 5; emulated 8: its iterations vary "
                                      "~3%% on 2 shared cores, the noisy case of the search's defaults)")
    bench_threshold.add_argument("--warmup", type=int, default=None,
                                 help="iterations discarded at the start of a probe (default 1; emulated 2: "
                                      "the first runs on parameters pulled before the switch, the second "
                                      "is the first transfer on the new connections)")
    bench_threshold.add_argument("--out", help="write the RUN.json record here")
    bench_threshold.add_argument("--json", action="store_true", help="print the comparison as JSON")
    bench_threshold.set_defaults(func=_bench_threshold)


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _ranking_for(name: str, batch: int):
    from geryon.categorize.profiles import model_key, resolve_profile
    from geryon.categorize.zoo import ZOO_NAMES, build_model

    if model_key(name) in ZOO_NAMES:
        from geryon.categorize.urgency import rank_parameters
        model, sample = build_model(name)
        return rank_parameters(model, sample), "torch forward pass"
    profile = resolve_profile(name, batch=batch)
    return profile.ranking(), profile.note or f"profile {profile.source}"


def _assignment(ranking, args):
    from geryon.categorize.classes import coarse_split, equal_thresholds, threshold_split

    if args.threshold is not None:
        thresholds = [t for t in args.threshold.split(",") if t.strip()]
        if args.classes is not None and args.classes != len(thresholds) + 1:
            raise ConfigError(f"--classes {args.classes} needs {args.classes - 1} thresholds, "
                              f"got {len(thresholds)}")
        return threshold_split(ranking, thresholds, metric=args.metric, max_classes=args.max_classes)
    classes = 2 if args.classes is None else args.classes
    if classes == 2:
        return coarse_split(ranking, max_classes=args.max_classes)
    return threshold_split(ranking, equal_thresholds(classes), metric=args.metric, max_classes=args.max_classes)


def _categorize(args) -> int:
    ranking, source = _ranking_for(args.model, args.batch)
    assignment = _assignment(ranking, args)
    classes = assignment.class_of
    if args.json:
        print(json.dumps({"model": args.model, "source": source,
                          "ranking": [p.to_dict() for p in ranking],
                          "assignment": assignment.to_data(), "digest": assignment.digest()}, indent=1))
        return 0
    total = sum(p.bytes for p in ranking) or 1
    print(f"# {args.model}: {len(ranking)} parameter tensors, {total / 1e6:.2f} MB ({source})")
    print(f"# split: {assignment.method}" + (f" at {', '.join(f'{t:g}' for t in assignment.thresholds)} "
                                               f"by {assignment.metric}" if assignment.thresholds else ""))
    print(f"{'rank':>4} {'class':>5} {'name':<34} {'layer':<26} {'type':<18} {'numel':>11} {'cum%':>6}")
    cumulative = 0
    for index, (param, cls) in enumerate(zip(ranking, classes)):
        cumulative += param.bytes
        flag = "" if param.used else "  (unused)"
        print(f"{index:>4} {cls:>5} {param.name:<34} {param.layer:<26} {param.module_type:<18} "
              f"{param.numel:>11} {100 * cumulative / total:>5.1f}%{flag}")
    for cls, (count, size) in enumerate(zip(assignment.tensors_per_class(), assignment.bytes_per_class())):
        print(f"class {cls}: {count} tensors, {size / 1e6:.2f} MB ({100 * size / total:.1f}% of bytes)")
    print(f"digest {assignment.digest()}")
    return 0


def _report_threshold(args) -> int:
    from geryon.categorize.report import render_threshold_report

    png, md = render_threshold_report(args.run, args.out)
    print(f"wrote {png}")
    print(f"wrote {md}")
    return 0


def _bench_threshold(args) -> int:
    from geryon.categorize.bench import analytic_measure, coarse_threshold, profile_context, run_threshold_bench
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
                          "on the emulated cluster runs in training: geryon launch --emulate --priority search "
                          "--max-classes K")
    settings = SearchSettings(budget=args.budget, first_round=args.first_round, classes=args.classes,
                              method=args.method, confirm=args.confirm,
                              iters_per_probe=args.iters_per_probe or (8 if emulated else 5),
                              warmup=args.warmup if args.warmup is not None else (2 if emulated else 1),
                              **candidates)
    if emulated:
        # The CLI is a composition point: the emulated backend composes transport and emulator.
        from geryon.bench.threshold import default_setup, run_emulated_threshold_bench
        setup = default_setup(args.model, workers=args.workers, servers=args.servers,
                              bandwidth=None if args.bandwidth is None else parse_rate(args.bandwidth),
                              time_scale=args.time_scale, size_scale=args.size_scale, metric=args.metric,
                              within_class=args.within_class, congestion=args.congestion,
                              spin_margin=args.spin_margin)
        record = run_emulated_threshold_bench(setup, settings, name=args.cluster_name,
                                              sweep_passes=args.sweep_passes or 3, seed=args.seed)
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
                                     sweep_passes=args.sweep_passes or 1, seed=args.seed,
                                     references={"coarse": coarse_threshold(profile, args.metric)})
        if args.out:
            write_run(args.out, record)
    extra = record["extra"]
    keys = ("chosen", "chosen_iter_s", "sweep_best", "sweep_best_iter_s", "probes", "ratio",
            "true_ratio", "sweep_ratio", "sweep_fit_ratio", "chosen_sweep_iter_s", "coarse_iter_s",
            "no_priority_iter_s", "iteration_noise", "wall_s", "true_best", "true_two_class_best_iter_s",
            "true_chosen_iter_s")
    result = {key: extra[key] for key in keys if key in extra}
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
                                                 else "") + ")")
    return 0
