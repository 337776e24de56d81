"""`geryon demo`: train a CNN on an emulated cluster without and with geryon, and compare the two.

The README's first command. It runs `geryon/examples/train_cnn.py` (shipped in the package, so it
works from any directory) through `python -m geryon.launch` on an emulated cluster (4 workers and 2
parameter servers, each a host behind a 100 Mbit/s switch port), once per policy (`vanilla`, then
`geryon`), shows each run's iterations as they happen (on stderr), and ends with a table: iteration
time, images/s, speedup over the first policy, final loss, test accuracy.

The model is the example's CNN with a wide hidden layer (`--hidden 2048`: 4.2 MB of parameters,
nearly all in one fully-connected layer behind ~60 KB of convolutions), so parameter traffic
dominates the iteration. Under `vanilla` whole tensors go to the servers round-robin and travel in
FIFO order, so that one layer loads one server; under `geryon` parameters are sliced over both
servers, and the convolutions (class 0, needed first by the next forward pass) move on their own
DSCP-marked flow that the switch serves first. Both runs train the same model on the same batches,
so their losses are equal; only the time differs. Iteration time is the mean over iterations 2..N
(the first includes setup). It needs root (network namespaces); the whole demo takes ~2 minutes.

Measured times: docs/transport.md. The priority check on its own is `geryon emulate check`.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from geryon.errors import ConfigError, GeryonError, require_root
from geryon.examples import script

EXAMPLE = script("train_cnn")  # shipped in the package: the demo runs from any directory
# With the wide hidden layer, 0.01 is the rate at which the loss visibly falls within ~24 iterations
# (measured single-process: 2.32 -> 2.22, test accuracy 8% -> 26%; 0.02 and above oscillate).
DEMO_LR = 0.01
DEFAULT_POLICIES = "vanilla,geryon"
WARMUP_ITERATIONS = 2  # iteration 0 includes connecting and the first pull; 1 the first full step


@dataclass(frozen=True)
class DemoRun:
    """One policy's run, summarised."""

    policy: str
    iterations: int
    iteration_s: float
    images_per_s: float
    final_loss: float
    accuracy: float
    wall_s: float
    speedup: float = 1.0


def add_commands(commands, bench) -> None:
    """Register `geryon demo [--iterations N] [--bw RATE] [--hidden H] [--policies A,B] [--json]`."""
    parser = commands.add_parser("demo", help="train a CNN on an emulated cluster without and with geryon",
                                 description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=24, help="training iterations per run (default 24)")
    parser.add_argument("--bw", default="100mbit", help="emulated link rate (default 100mbit)")
    parser.add_argument("--hidden", type=int, default=2048,
                        help="units of the CNN's hidden linear layer (default 2048: 4.2 MB of parameters)")
    parser.add_argument("--width", type=int, default=16, help="channels of the CNN's first conv layer")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size (default 64)")
    parser.add_argument("--workers", type=int, default=4, help="workers (default 4)")
    parser.add_argument("--servers", type=int, default=2, help="parameter servers (default 2)")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"policies to compare, the first is the baseline (default {DEFAULT_POLICIES})")
    parser.add_argument("--ps-pull", choices=("end", "ahead"), default="end",
                        help="when the workers ask for the next parameters: once step() runs (end, the "
                             "default) or with the first push of backward (ahead); see docs/ps-optimizers.md")
    parser.add_argument("--timeline", metavar="PREFIX", default=None,
                        help="also write each run's trace to PREFIX-<policy>.json")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run_from_args)


def launch_argv(policy: str, args, timeline: str | None = None) -> list[str]:
    """The `python -m geryon.launch` command line of one run."""
    argv = [sys.executable, "-m", "geryon.launch", "--emulate", "--bw", args.bw, "--mode", "ps",
            "--workers", str(args.workers), "--servers", str(args.servers), "--policy", policy,
            "--grace", "2", "--timeout", str(60 + 30 * args.iterations),
            "--ps-pull", getattr(args, "ps_pull", "end")]
    if timeline:
        argv += ["--timeline", timeline]
    return argv + [str(EXAMPLE), "--iterations", str(args.iterations), "--width", str(args.width),
                   "--global-batch-size", str(args.batch_size), "--lr", str(DEMO_LR),
                   "--hidden", str(args.hidden), "--train-size", "1024", "--test-size", "200", "--log-json"]


def summarise(policy: str, records: list[dict], wall_s: float, batch_size: int = 64) -> DemoRun:
    """A run's numbers from worker 0's JSON records."""
    times = [r["time_s"] for r in records if "iteration" in r]
    final = next((r for r in records if r.get("final")), None)
    if not times or final is None:
        raise GeryonError(f"the {policy} run reported no iterations")
    first = min(WARMUP_ITERATIONS, len(times) - 1)
    if first > 0:
        iteration_s = (times[-1] - times[first - 1]) / (len(times) - first)
    else:
        iteration_s = times[0]
    return DemoRun(policy=policy, iterations=len(times), iteration_s=round(iteration_s, 4),
                   images_per_s=round(batch_size / iteration_s, 1), final_loss=final["loss"],
                   accuracy=final["accuracy"], wall_s=round(wall_s, 1))


def run_policy(policy: str, args, progress=sys.stderr) -> DemoRun:
    """Run the job with one policy, echoing its progress; raises GeryonError if it fails."""
    timeline = f"{os.path.abspath(args.timeline)}-{policy}.json" if args.timeline else None
    argv = launch_argv(policy, args, timeline)
    print(f"== {policy}: {args.workers} workers, {args.servers} servers at {args.bw}, pull "
          f"{getattr(args, 'ps_pull', 'end')} (building the cluster, starting ranks)", file=progress, flush=True)
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    records, last = [], 0.0
    try:
        for line in process.stdout:
            if not line.startswith("[worker0] {"):
                continue
            record = json.loads(line.split("] ", 1)[1])
            records.append(record)
            if "iteration" in record:
                step = record["time_s"] - last
                last = record["time_s"]
                print(f"   {policy:8s} iteration {record['iteration'] + 1:3d}/{args.iterations}  "
                      f"loss {record['loss']:.4f}  {step:6.2f} s", file=progress, flush=True)
        errors = process.stderr.read()
        process.wait()
    except BaseException:
        process.terminate()  # the launcher stops its ranks and removes the cluster on SIGTERM
        process.wait()
        raise
    if process.returncode != 0:
        tail = "\n".join(errors.strip().splitlines()[-12:])
        raise GeryonError(f"the {policy} run failed (exit {process.returncode}):\n{tail}")
    return summarise(policy, records, time.monotonic() - started, args.batch_size)


def with_speedups(runs: list[DemoRun]) -> list[DemoRun]:
    """Each run's speedup in iteration time over the first (the baseline)."""
    base = runs[0].iteration_s
    return [DemoRun(**{**asdict(r), "speedup": round(base / r.iteration_s, 2)}) for r in runs]


def format_table(runs: list[DemoRun]) -> str:
    lines = [f"{'policy':8s}  {'iteration':>10s}  {'images/s':>9s}  {'speedup':>7s}  {'final loss':>10s}"
             f"  {'accuracy':>8s}",
             f"{'-' * 8}  {'-' * 10}  {'-' * 9}  {'-' * 7}  {'-' * 10}  {'-' * 8}"]
    for run in runs:
        lines.append(f"{run.policy:8s}  {run.iteration_s:9.3f}s  {run.images_per_s:9.1f}  "
                     f"{run.speedup:6.2f}x  {run.final_loss:10.4f}  {run.accuracy:8.1%}")
    return "\n".join(lines)


def run_from_args(args) -> int:
    require_root("geryon demo (an emulated cluster in network namespaces)")
    if not EXAMPLE.is_file():
        raise ConfigError(f"the demo runs {EXAMPLE}, which is missing: reinstall geryon")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or args.iterations < 1:
        raise ConfigError("give at least one policy and --iterations >= 1")
    started = time.monotonic()
    runs = with_speedups([run_policy(policy, args) for policy in policies])
    wall = time.monotonic() - started
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "bw": args.bw, "workers": args.workers,
                          "servers": args.servers, "hidden": args.hidden, "wall_s": round(wall, 1)}))
    else:
        print(f"\n{args.workers} workers, {args.servers} parameter servers, {args.bw} links, "
              f"{args.iterations} iterations per run ({wall:.0f} s in all)\n")
        print(format_table(runs))
    return 0
