"""`geryon bench straggler`: time to a training-loss target with one slow worker, four ways to sync.

Runs the example (geryon/examples/train_cnn.py) through `python -m geryon.launch --emulate` with W
workers (default 8), for each slowdown (default: none, one worker 2x and 5x slower, --straggler) and
each way to synchronise: full allreduce (--sync full), partial allreduce with the static schedule
(--sync partial-static) and with the straggler-aware generator (--sync partial), and a parameter
server (--mode ps). From worker 0's per-iteration losses it reports the first iteration, and its
time, at which the mean of the last SMOOTHING losses is at or below the target (--target). Under
--sync partial worker 0's loss is its own minibatch's (the example does not average it, which would
make every worker wait); elsewhere it is the mean over workers. The slow worker is the last one, so
worker 0 is always a fast one.

Beside the table it prints the paper's figures (Ripples, VGG-16 on CIFAR-10, 16 workers):
PAPER_FIGURES. Results: docs/partial-allreduce.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from geryon.errors import ConfigError, GeryonError, PermissionNeeded

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "train_cnn.py")
SMOOTHING = 5
WAYS = {   # name: the launcher's flags
    "allreduce": ("--sync", "full"),
    "partial-static": ("--sync", "partial-static"),
    "partial": ("--sync", "partial"),
    "ps": ("--mode", "ps", "--servers", "1"),
}
PAPER_FIGURES = ("Ripples (16 workers, VGG-16/CIFAR-10): workers alike, 1.1x faster than All-Reduce; "
                 "one worker 2x slower: overall speedup over PS 1.66x All-Reduce, 2.47x static, 4.23x smart "
                 "generator (2.5x All-Reduce); heterogeneous, 2x to 4.4x over All-Reduce")


@dataclass
class StragglerRun:
    way: str
    slowdown: float
    iterations: int | None      # to the target (None: not reached)
    seconds: float | None
    final_loss: float
    wall_s: float


def add_command(bench) -> None:
    parser = bench.add_parser("straggler", help="time to a loss target with one slow worker: allreduce, "
                                                "partial allreduce (static, straggler-aware) and PS")
    parser.add_argument("--workers", type=int, default=8, help="workers (default 8)")
    parser.add_argument("--bw", default="1gbit", help="emulated link rate (default 1gbit)")
    parser.add_argument("--slowdowns", default="1,2,5",
                        help="factors of the last worker's slowdown, comma-separated (default 1,2,5)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"which to run (default {','.join(WAYS)})")
    parser.add_argument("--target", type=float, default=1.0, help="training-loss target (default 1.0)")
    parser.add_argument("--iterations", type=int, default=300, help="iterations per worker (default 300)")
    parser.add_argument("--width", type=int, default=8, help="channels of the CNN's first conv layer (default 8)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per worker per iteration (default 32)")
    parser.add_argument("--json", action="store_true", help="print the runs as one JSON object")
    parser.set_defaults(func=run_from_args)


def launch_argv(way: str, slowdown: float, args) -> list[str]:
    """The `python -m geryon.launch` command line of one run."""
    argv = [sys.executable, "-m", "geryon.launch", "--emulate", "--bw", args.bw, "--workers", str(args.workers),
            "--grace", "2", "--timeout", str(120 + 5 * args.iterations), *WAYS[way]]
    if slowdown > 1:
        argv += ["--straggler", f"{args.workers - 1}:{slowdown:g}"]
    return argv + [EXAMPLE, "--iterations", str(args.iterations), "--width", str(args.width),
                   "--batch-size", str(args.batch_size), "--train-size", "2048", "--test-size", "200",
                   "--log-json"]


def time_to_target(records: list[dict], target: float) -> tuple[int | None, float | None]:
    """(iterations, seconds) at the first iteration whose last SMOOTHING losses average <= target."""
    losses = []
    for record in records:
        losses.append(record["loss"])
        window = losses[-SMOOTHING:]
        if len(window) == SMOOTHING and sum(window) / SMOOTHING <= target:
            return record["iteration"] + 1, record["time_s"]
    return None, None


def run_one(way: str, slowdown: float, args, progress=sys.stderr) -> StragglerRun:
    argv = launch_argv(way, slowdown, args)
    print(f"== {way}, slowdown {slowdown:g}: {' '.join(argv[1:])}", file=progress, flush=True)
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-12:])
        raise GeryonError(f"the {way} run (slowdown {slowdown:g}) failed:\n{tail}")
    records = [json.loads(line.split("] ", 1)[1]) for line in result.stdout.splitlines()
               if line.startswith("[worker0] {")]
    steps = [r for r in records if "iteration" in r]
    final = next((r for r in records if r.get("final")), None)
    if not steps or final is None:
        raise GeryonError(f"the {way} run (slowdown {slowdown:g}) reported no iterations")
    iterations, seconds = time_to_target(steps, args.target)
    return StragglerRun(way, slowdown, iterations, seconds, final["loss"], round(time.monotonic() - started, 1))


def run_from_args(args) -> int:
    if os.geteuid() != 0:
        raise PermissionNeeded("geryon bench straggler runs its jobs on an emulated cluster in network "
                               "namespaces and needs root; run it with sudo")
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown or not ways:
        raise ConfigError(f"--ways {args.ways!r}: choose among {', '.join(WAYS)}")
    try:
        slowdowns = [float(s) for s in args.slowdowns.split(",")]
    except ValueError:
        raise ConfigError(f"--slowdowns {args.slowdowns!r}: factors such as 1,2,5") from None
    runs = [run_one(way, slowdown, args) for slowdown in slowdowns for way in ways]
    if args.json:
        print(json.dumps({"target": args.target, "workers": args.workers, "bw": args.bw,
                          "load_average": os.getloadavg(), "runs": [asdict(r) for r in runs],
                          "paper": PAPER_FIGURES}))
    else:
        print(format_runs(runs, args))
    return 0


def format_runs(runs: list[StragglerRun], args) -> str:
    lines = [f"{args.workers} workers at {args.bw}, loss target {args.target:g} (mean of {SMOOTHING} iterations), "
             f"load average at the end {os.getloadavg()[0]:.1f}",
             f"{'slowdown':>8s}  {'way':15s} {'iterations':>10s} {'seconds':>8s} {'vs allreduce':>12s} "
             f"{'final loss':>10s}"]
    base = {r.slowdown: r.seconds for r in runs if r.way == "allreduce"}
    for run in runs:
        its = str(run.iterations) if run.iterations is not None else "-"
        secs = f"{run.seconds:.1f}" if run.seconds is not None else "not reached"
        ref = base.get(run.slowdown)
        ratio = f"x{ref / run.seconds:.2f}" if ref and run.seconds else "-"
        lines.append(f"{run.slowdown:>8g}  {run.way:15s} {its:>10s} {secs:>8s} {ratio:>12s} {run.final_loss:10.4f}")
    lines.append(f"paper: {PAPER_FIGURES}")
    return "\n".join(lines)
