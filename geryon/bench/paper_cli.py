"""`geryon bench paper`: the command line of the paper-table benchmark (geryon.bench.paper).

    geryon bench paper [--mode ps|allreduce] [--model vgg19|resnet50|alexnet|inceptionv3|all] [--link 10gbe|40gbe|all]
                       [--workers 8] [--layout colocated|separate] [--congestion bbr[,cubic]]
                       [--slice-params 1024K,512K,256K|none] [--timeline DIR] [--json] [--out DIR]

Needs root (namespaces, tc). Progress lines go to stderr; `--json` prints one JSON object per row on
stdout (the scaling table, the control row, then the slicing table); `--out DIR` writes paper.json,
paper.md and paper.png there.
"""

from __future__ import annotations

import json
import sys

from geryon.bench.paper_math import CLASS_THREAD_NICE, COMPUTE_RT_PRIORITY, MODELS, THREAD_RT_PRIORITY
from geryon.sim.paper import LINKS
from geryon.emulate.cluster import add_ack_priority_argument
from geryon.errors import ConfigError
from geryon.rates import parse_rate


def add_commands(commands, bench) -> None:
    paper = bench.add_parser("paper", help="the paper's scaling table, measured (replayed models, emulated cluster)")
    paper.add_argument("--mode", choices=("ps", "allreduce"), default="ps",
                       help="ps (default: the paper's parameter servers) or allreduce (a ring of the workers, "
                            "DDP's buckets; each policy with the barrier and with +overlap unless "
                            "--policies names +overlap cells itself)")
    paper.add_argument("--model", default="vgg19",
                       help=f"{', '.join(MODELS)}, a comma-separated list, or all (default vgg19)")
    paper.add_argument("--link", default="all", help="10gbe, 40gbe or all (default all: both)")
    paper.add_argument("--workers", type=int, default=8, help="workers (and servers), default 8")
    paper.add_argument("--layout", choices=("colocated", "separate"), default="colocated",
                       help="colocated (default): a worker and a server per host; separate: servers apart")
    paper.add_argument("--policies", default="vanilla,slicing,endhost,geryon",
                       help="comma-separated; variants like geryon+bytes (byte-balanced placement), "
                            "geryon+fifo, geryon+threshold")
    paper.add_argument("--congestion", default="bbr", help="TCP congestion control(s): bbr, cubic, bbr,cubic")
    paper.add_argument("--repetitions", type=int, default=3, help="rounds over the policies (default 3)")
    paper.add_argument("--iterations", type=int, default=3, help="measured iterations per segment (default 3)")
    paper.add_argument("--warmup", type=int, default=2, help="iterations discarded per segment (default 2)")
    paper.add_argument("--size-scale", type=float, default=0.01, help="tensor bytes x this (default 0.01)")
    paper.add_argument("--wall-scale", type=float, default=1.0, help="emulated seconds per paper second")
    paper.add_argument("--compute-scale", type=float, default=None,
                       help="paper compute / profiled compute; default: calibrate on VGG-19 vanilla 10GbE")
    paper.add_argument("--slice", default="1024K", help="parameters per slice of the main table (default 1024K)")
    paper.add_argument("--slice-params", default="1024K,512K,256K",
                       help="the slicing-size table (VGG-19, 10GbE), or none")
    paper.add_argument("--priority", default="coarse",
                       help="classes: coarse (CONV high, FC low) or threshold=T (position threshold)")
    paper.add_argument("--placement", choices=("count", "bytes"), default="count",
                       help="slices over servers: round-robin by count (P3) or byte-balanced")
    paper.add_argument("--notsent-lowat", type=int, default=16 * 1024,
                       help="TCP_NOTSENT_LOWAT of every flow in bytes (default 16384)")
    paper.add_argument("--no-control", action="store_true", help="skip the control-nolimit row")
    paper.add_argument("--nice", type=int, default=0,
                       help="niceness of the role processes (e.g. -10: ahead of other load on a shared machine)")
    paper.add_argument("--control-rate", default="10gbit",
                       help="port rate of the control row (default 10gbit: HTB never binds, the CPU does)")
    paper.add_argument("--pull", choices=("end", "ahead"), default="end",
                       help="when a worker asks for the next parameters: after its last push (end, the "
                            "default: the paper's TensorFlow PS reads every variable at the next step's "
                            "start, and geryon's runtime pulls after optimizer.step()) or with its first "
                            "push (ahead: MXNet KVStore / BytePS's per-key pull, each shard answered once "
                            "updated)")
    paper.add_argument("--class-thread-nice", type=int, default=CLASS_THREAD_NICE,
                       help="niceness added per class index to the transport threads of every role "
                            "(TransportConfig.class_thread_nice; default 10, 0 = off)")
    paper.add_argument("--thread-rt", type=int, default=THREAD_RT_PRIORITY,
                       help="SCHED_RR priority of the transport threads in every role, class c at this "
                            "- c (TransportConfig.thread_rt_priority; default 2, 0 = off): 16 role "
                            "processes share this machine's cores, where real hosts have their own")
    paper.add_argument("--compute-rt", type=int, default=COMPUTE_RT_PRIORITY,
                       help="SCHED_RR priority of each worker's replayed compute (default 3, above the "
                            "transport threads; 0 = off): it stands for a GPU, which a real host's "
                            "transport does not slow down")
    add_ack_priority_argument(paper, "for every policy alike")
    paper.add_argument("--timeline", metavar="DIR", help="write a Chrome trace per (model, link, policy) here")
    paper.add_argument("--json", action="store_true", help="one JSON object per row on stdout")
    paper.add_argument("--out", metavar="DIR", help="write paper.json, paper.md and paper.png here")
    paper.set_defaults(func=_bench_paper)


def _list(text: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


def settings_from_args(args):
    from geryon.bench.paper import PaperSettings, parse_params

    models = MODELS if args.model.lower() == "all" else _list(args.model.replace("-", ""))
    for model in models:
        if model not in MODELS:
            raise ConfigError(f"model {model!r}: choose from {', '.join(MODELS)} or all")
    links = tuple(LINKS) if args.link.lower() == "all" else _list(args.link)
    priority, threshold = "coarse", 0.5
    if args.priority.startswith("threshold"):
        priority = "threshold"
        if "=" in args.priority:
            threshold = float(args.priority.split("=", 1)[1])
    elif args.priority != "coarse":
        raise ConfigError(f"--priority {args.priority!r}: coarse or threshold=T")
    table = () if args.slice_params.lower() in ("", "none") else tuple(
        parse_params(p) for p in args.slice_params.split(","))
    policies = _list(args.policies)
    if args.mode == "allreduce":
        policies = allreduce_policies(policies)
    return PaperSettings(mode=args.mode, models=models, links=links, workers=args.workers, layout=args.layout,
                         policies=policies, congestions=_list(args.congestion),
                         repetitions=args.repetitions, warmup=args.warmup, iterations=args.iterations,
                         size_scale=args.size_scale, wall_scale=args.wall_scale,
                         compute_scale=args.compute_scale, slice_params=parse_params(args.slice),
                         slice_table=table, control=not args.no_control, priority=priority,
                         threshold=threshold, placement=args.placement, notsent_lowat=args.notsent_lowat,
                         timeline=args.timeline, control_rate=parse_rate(args.control_rate),
                         nice=args.nice, pull=args.pull, class_thread_nice=args.class_thread_nice,
                         thread_rt=args.thread_rt, compute_rt=args.compute_rt,
                         ack_priority=args.ack_priority)


def allreduce_policies(policies: tuple[str, ...]) -> tuple[str, ...]:
    """Allreduce mode's cells: each policy with DDP's barrier and with +overlap, or, where the list
    names +overlap cells itself, the list as given (e.g. vanilla,geryon+overlap)."""
    if any("overlap" in name.split("+")[1:] for name in policies):
        return policies
    return tuple(cell for name in policies for cell in (name, f"{name}+overlap"))


def _bench_paper(args) -> int:
    from geryon.bench.paper import run_paper_bench, write_outputs
    from geryon.errors import require_root

    settings = settings_from_args(args)
    require_root("geryon bench paper")
    record = run_paper_bench(settings, progress=lambda line: print(line, file=sys.stderr, flush=True),
                             on_model_done=(lambda so_far: write_outputs(so_far, args.out)) if args.out else None)
    if args.out:
        paths = write_outputs(record, args.out)
        print(f"wrote {paths['json']}, {paths['markdown']}, {paths['png']}", file=sys.stderr)
    if args.json:
        for row in record["rows"] + record["slicing_rows"]:
            print(json.dumps({k: v for k, v in row.items() if k != "times"}))
    else:
        from geryon.bench.paper_report import markdown_report

        print(markdown_report(record))
    return 0
