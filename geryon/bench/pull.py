"""`geryon bench pull`: a real training script in PS mode, pulling at the end vs pulling ahead.

Runs `geryon demo`'s job (geryon/examples/train_cnn.py through `python -m geryon.launch` on an
emulated cluster, geryon.demo.run_policy) with `--ps-pull end` and `--ps-pull ahead`, interleaved and
rotated per repetition so machine drift hits both alike, and prints each mode's median iteration time,
the ratio end / ahead (> 1: ahead is faster) and whether every run ended with the same loss (it must:
pulling ahead changes when updates travel, not what they are).

Pulling ahead can only win where backward still runs after the big layers' pushes are done: its gain
is at most the time the servers need to send those layers back. The defaults (2 workers, 2 servers,
a 64-wide CNN with a 2048-wide hidden layer, 400 Mbit/s ports) are such a case on a 2-core machine;
with the demo's settings (4 workers, 100 Mbit/s) the pushes outlast backward and the two modes tie.
Results: docs/ps-optimizers.md ("Pulling ahead").
"""

import json
import statistics
import sys
from argparse import Namespace

from geryon.errors import ConfigError, require_root

MODES = ("end", "ahead")


def add_command(bench) -> None:
    parser = bench.add_parser("pull", help="PS mode: --ps-pull end vs ahead on a real training script")
    parser.add_argument("--bw", default="400mbit", help="emulated link rate (default 400mbit)")
    parser.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    parser.add_argument("--servers", type=int, default=2, help="parameter servers (default 2)")
    parser.add_argument("--width", type=int, default=64, help="channels of the CNN's first conv layer (default 64)")
    parser.add_argument("--hidden", type=int, default=2048, help="width of the hidden dense layer (default 2048)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size (default 64)")
    parser.add_argument("--iterations", type=int, default=12, help="training iterations per run (default 12)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (default 3)")
    parser.add_argument("--policy", default="geryon", help="transport policy of every run (default geryon)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(func=run_from_args)


def run_from_args(args) -> int:
    from geryon.demo import run_policy

    require_root("geryon bench pull (the job runs on an emulated cluster in network namespaces)")
    if args.repeat < 1 or args.iterations < 3:
        raise ConfigError("--repeat must be at least 1 and --iterations at least 3 (the first two are warm-up)")
    runs = {mode: [] for mode in MODES}
    for repetition in range(args.repeat):
        order = MODES if repetition % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            job = Namespace(**{**vars(args), "ps_pull": mode, "timeline": None})
            print(f"== repetition {repetition + 1}/{args.repeat}, --ps-pull {mode}", file=sys.stderr, flush=True)
            runs[mode].append(run_policy(args.policy, job))
    result = summarise(runs)
    result.update(bw=args.bw, workers=args.workers, servers=args.servers, width=args.width,
                  hidden=args.hidden, policy=args.policy, iterations=args.iterations)
    if args.json:
        print(json.dumps(result))
    else:
        print(format_result(result))
    return 0 if result["same_loss"] else 1


def summarise(runs: dict) -> dict:
    """Per mode the iteration times and their median; end / ahead; every final loss equal?"""
    medians = {mode: statistics.median(r.iteration_s for r in runs[mode]) for mode in MODES}
    losses = {r.final_loss for mode in MODES for r in runs[mode]}
    return {"iteration_s": {mode: [r.iteration_s for r in runs[mode]] for mode in MODES},
            "median_s": medians, "speedup_ahead": round(medians["end"] / medians["ahead"], 3),
            "same_loss": len(losses) == 1, "final_loss": sorted(losses)}


def format_result(result: dict) -> str:
    lines = [f"{result['policy']}, {result['workers']} workers, {result['servers']} servers at {result['bw']}, "
             f"width {result['width']}, hidden {result['hidden']}:"]
    for mode in MODES:
        times = ", ".join(f"{t:.3f}" for t in result["iteration_s"][mode])
        lines.append(f"  --ps-pull {mode:5s}  median {result['median_s'][mode]:.3f} s/iteration  ({times})")
    lines.append(f"  ahead is x{result['speedup_ahead']:.3f} faster; same final loss in every run: "
                 f"{'yes' if result['same_loss'] else 'NO ' + str(result['final_loss'])}")
    return "\n".join(lines)
