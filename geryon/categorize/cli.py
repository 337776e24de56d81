"""Commands of the categorizer: `geryon categorize`, `geryon report threshold`.

    geryon categorize MODEL [--classes K] [--threshold T[,T...]] [--metric position|bytes] [--json]
        MODEL: a built-in CNN (smallcnn, minivgg, miniresnet), a profile (vgg16, vgg19, resnet50,
        inceptionv3, alexnet -- shipped in the package, or from $GERYON_PROFILES), or a .dag path.
        Without thresholds: two classes, the coarse CONV/FC split; K > 2 without thresholds: K
        evenly spaced thresholds.
    geryon report threshold RUN.json [--out DIR]
    (`geryon bench threshold`, the search against the exhaustive sweep, is in geryon.bench.cli.)
"""

import json
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
