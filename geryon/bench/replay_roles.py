"""The processes of a replayed-model PS job, driven one command at a time over stdin/stdout.

    python -m geryon.bench.replay_roles worker --rank R --workers W --model vgg19 ...
    python -m geryon.bench.replay_roles server --index S --servers M --workers W --model vgg19 ...
    python -m geryon.bench.replay_roles ring --rank R --workers W --servers W --model vgg19 ...

Each reads one JSON command per line on stdin and answers one JSON line on stdout
({"ok": true, ...} or {"ok": false, "error": "..."}); logs go to stderr. The driver
(`geryon.bench.threshold`) runs them inside the hosts of an emulated cluster.

A worker is a `ReplayedModel` (profiled per-layer compute, real tensors of the profiled sizes times
`--size-scale`) on a `PSWorker`: layer l's forward waits for layer l's pulled parameter
(`wait_param`), layer l's gradient is pushed as soon as its backward is done, and the pull of the
next version is requested when the backward pass ends (`--pull-ahead`: with its first push, so each
server answers a shard as soon as its update is made). Commands:
    connect {threshold, servers: [[ip, port], ...]}  join the servers with the classes of
             threshold_split(ranking, [threshold]); answers the assignment digest
    step     one iteration; answers its seconds (forward start to backward end), the time
             blocked on pulls, and `run_wait_s` / `run_wait_all_s`: how long the replay thread /
             all of this process's threads (summed) were runnable but not running (waiting for a
             CPU, /proc schedstat) during the step -- the CPU contention an emulated cluster on a
             few shared cores adds to an iteration -- and `run_schedulings` / `run_schedulings_all`:
             how many times they were put on a CPU (once per wake-up)
    drain    wait for the pulled parameters, leave the servers; answers the parameter digest and
             `applied` (see below)
    exit
With `--compute-rt P` the replay thread runs SCHED_RR at P while it steps (compute included): the
replayed compute stands for a GPU, which a real host's transport threads never delay, so where those
threads are real-time (`--thread-rt`) the compute runs above them.
A ring worker (allreduce mode, no servers) is geryon.bench.replay_ddp's.
A server holds its shards of every parameter in a `ParameterServer`. Commands:
    listen {threshold}   serve with that assignment on a fresh port; answers the port and digest
    drain                wait until every worker left, keep the shard values, close; answers `applied`
    exit

Switching the assignment: the transport fixes each tensor's class when a PSWorker/ParameterServer
is built (it is part of the shard-plan digest both sides compare), so a switch is an iteration
boundary at which workers drain (every pushed update applied and pulled back), servers keep their
values, and both sides reconnect with the new classes, checked by the transport's plan digest and
by our assignment digest. Transport versions restart at 0 per connection; `applied` counts updates
across all of them: every gradient is 1.0 and SGD runs without momentum at lr 2^-10 from 0, so
after n applied iterations every element is exactly -n * 2^-10 (exact in float32). An update lost
or applied twice anywhere shows up as an element off that value, reported as inconsistent.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time
from typing import NamedTuple

import torch

from geryon import envvars
from geryon.quickexit import exit_without_collecting
from geryon.categorize.classes import coarse_split, threshold_split
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.replay import SLEEP_MARGIN_S, ReplayedModel
from geryon.errors import GeryonError
from geryon.timeline import RankTimeline
from geryon.transport import ParameterServer, PSWorker, TransportConfig

LEARNING_RATE = 2.0 ** -10
GIL_SWITCH_INTERVAL_S = 0.0002   # the replay spins for sub-ms layers; let receiver threads in


def _reply(**record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def applied_updates(tensors) -> int | None:
    """n if every element of every tensor is exactly -n * LEARNING_RATE (same n), else None."""
    counts = set()
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        count = round(float(-tensor[0]) / LEARNING_RATE)
        if not bool(torch.all(tensor == -count * LEARNING_RATE)):
            return None
        counts.add(count)
    return counts.pop() if len(counts) == 1 else (0 if not counts else None)


def params_digest(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


# what `connect`/`listen` may change per connection (bench paper switches policies without restarting)
TRANSPORT_OVERRIDES = ("policy", "slice_bytes", "congestion", "notsent_lowat", "placement",
                       "within_class", "priority", "dscp")  # dscp: "46,0", the classes' marks (--dscp)


class RunQueueWait(NamedTuple):
    """This process's time runnable but waiting for a CPU so far (Linux schedstat), and how often its
    threads were put on a CPU: each time a thread wakes (a sleep ends, a wait is notified) it is
    scheduled in once, so wait / schedulings is what one wake-up waits for a CPU."""
    main_s: float          # the main (replay) thread
    all_s: float           # every thread, summed
    main_schedulings: int
    all_schedulings: int


def run_queue_wait_s() -> RunQueueWait | None:
    """This process's run-queue wait so far (/proc/self/task/*/schedstat: the second field, seconds
    waited; the third, times scheduled in); None where it is not available."""
    main = str(os.getpid())
    total = mine = total_count = my_count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as handle:
                _, waited, count = (int(field) for field in handle.read().split()[:3])
        except (OSError, ValueError):
            continue   # a thread that ended meanwhile
        total += waited
        total_count += count
        if tid == main:
            mine, my_count = waited, count
    return RunQueueWait(mine * 1e-9, total * 1e-9, my_count, total_count)


def run_queue_fields(before: RunQueueWait | None, after: RunQueueWait | None) -> dict:
    """A step's record fields from the run-queue wait before and after it (none where schedstat is
    missing): `run_wait_s` / `run_wait_all_s` the replay thread's / every thread's wait, and
    `run_schedulings` / `run_schedulings_all` how many times they were scheduled in meanwhile."""
    if before is None or after is None:
        return {}
    return {"run_wait_s": after.main_s - before.main_s, "run_wait_all_s": after.all_s - before.all_s,
            "run_schedulings": after.main_schedulings - before.main_schedulings,
            "run_schedulings_all": after.all_schedulings - before.all_schedulings}


@contextlib.contextmanager
def compute_priority(rt_priority: int):
    """Run the calling thread SCHED_RR at `rt_priority` inside the block (0: leave it as it is), then
    back to normal scheduling. Best effort: where real-time scheduling is refused, nothing changes.
    Only the block is real-time, so threads started elsewhere by this one do not inherit it."""
    raised = False
    if rt_priority:
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(rt_priority))
            raised = True
        except OSError:
            pass
    try:
        yield
    finally:
        if raised:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _config(args, overrides: dict | None = None, tracer=None) -> TransportConfig:
    settings = {"policy": args.policy, "slice_bytes": args.slice_bytes, "congestion": args.congestion,
                "notsent_lowat": 128 * 1024, "placement": "count"}
    settings.update({k: v for k, v in (overrides or {}).items()
                     if k in settings and v is not None})
    return TransportConfig(secret=os.environ.get(envvars.JOB_SECRET, ""), job_id=args.job,
                           policy=settings["policy"],
                           class_dscp=tuple(int(d) for d in ((overrides or {}).get("dscp") or args.dscp).split(",")),
                           slice_bytes=int(settings["slice_bytes"]), timeout=args.timeout,
                           tcp_congestion=settings["congestion"] or None,
                           notsent_lowat=settings["notsent_lowat"] or None,
                           placement=settings["placement"], tracer=tracer,
                           class_thread_nice=args.class_thread_nice,
                           thread_rt_priority=args.thread_rt)


def _check_overrides(overrides: dict | None) -> dict:
    unknown = sorted(set(overrides or {}) - set(TRANSPORT_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown transport settings {unknown}; known: {', '.join(TRANSPORT_OVERRIDES)}")
    return dict(overrides or {})


def _replayed_model(args) -> ReplayedModel:
    # on 2 shared cores, W spinning workers starve the servers and the kernel's forwarding, so the
    # bench may spin less than the replay's default (--spin-margin)
    return ReplayedModel(resolve_profile(args.model, batch=args.batch), time_scale=args.time_scale,
                         size_scale=args.size_scale, gradient_value=1.0, spin_margin=args.spin_margin,
                         async_push=args.async_push)


def _priorities(ranking, threshold: float, args, overrides: dict | None = None):
    """The assignment for `threshold` and the transport's (class, urgency) per tensor.

    Within a class the send queues order by urgency ("urgency": end-host scheduling on top of the
    network's) or by arrival ("fifo": urgency 0 for all, the paper's Geryon, where only the
    network's priority queues reorder traffic, and the analytic model's assumption).
    overrides["priority"] == "coarse" takes the slides' CONV/FC split instead of the threshold.
    """
    overrides = overrides or {}
    if overrides.get("priority") == "coarse":
        assignment = coarse_split(ranking, max_classes=2)
    else:
        assignment = threshold_split(ranking, [threshold], metric=args.metric, max_classes=2)
    fifo = (overrides.get("within_class") or args.within_class) == "fifo"
    return assignment, [(cls, 0 if fifo else index) for index, cls in enumerate(assignment.class_of)]


class LayerwisePSWorker(PSWorker):
    """A PSWorker pushed one tensor at a time (`push_tensor`, as each layer's backward ends).

    pull_ahead=False: the pull of the next version is asked for once every gradient is pushed, as
    the paper's TensorFlow PS reads every variable at the next step's start and as geryon.runtime's
    PS mode does (it must wait for the optimizer's STEP settings). pull_ahead=True: it is asked for
    with the iteration's first push, so each server answers every shard the moment its update is
    made -- the FC layers' parameters come back while the backward pass still runs, as with MXNet
    KVStore's or BytePS's per-key pull. Safe here: a shard's next version needs this worker's own
    push of it, so it can only land after that layer's backward is done, and the forward pass
    before it waited for every parameter.
    """

    pull_ahead = False

    def push_tensor(self, tensor: int, grad) -> None:
        if self.pull_ahead and self.pull_iteration <= self.iteration:   # the iteration's first push
            self.pull(self.iteration + 1)
        super().push_tensor(tensor, grad)

    def next_iteration(self) -> None:
        """Every gradient of this iteration is pushed: ask for the next version of the parameters
        (unless the first push already did)."""
        self.iteration += 1
        if self.pull_iteration < self.iteration:
            self.pull(self.iteration)


class ReplayedWorker:
    """One worker process: the replayed model and its (current) connection to the servers."""

    def __init__(self, args):
        self.args = args
        self.model = _replayed_model(args)
        self.ranking = self.model.profile.ranking()   # classes in the profile's (unscaled) terms
        self.tensor_of = {p.name: index for index, p in enumerate(self.ranking)}
        self.params = [self.model.parameters[p.name] for p in self.ranking]
        self.transport: LayerwisePSWorker | None = None
        self.blocked_s = 0.0
        self.offline = False                 # compute only: no pulls, no pushes
        self.timeline: RankTimeline | None = None
        self.model.add_pull_hook(self._before_forward)
        self.model.add_push_hook(self._after_backward)
        self.model.add_layer_hook(self._layer_done)

    def _before_forward(self, _index, name) -> None:
        tensor = self.tensor_of.get(name)
        if tensor is not None and not self.offline:
            entered = time.perf_counter()
            self.transport.wait_param(tensor)
            left = time.perf_counter()
            self.blocked_s += left - entered
            if self.timeline is not None and left - entered > 1e-4:
                self.timeline.span(f"wait {name}", "wait", _wall(entered), _wall(left),
                                   args={"tensor": tensor})

    def _after_backward(self, _index, name, gradient) -> None:
        if not self.offline:
            self.transport.push_tensor(self.tensor_of[name], gradient)

    def _layer_done(self, kind, _index, name, start, end) -> None:
        if self.timeline is not None:
            self.timeline.span(f"{kind} {name}", kind, _wall(start), _wall(end))

    def connect(self, threshold: float, servers, transport: dict | None = None,
                trace: str | None = None) -> dict:
        overrides = _check_overrides(transport)
        assignment, priorities = _priorities(self.ranking, threshold, self.args, overrides)
        self.timeline = RankTimeline(trace, f"worker{self.args.rank}") if trace else None
        tracer = self.timeline.transfer if self.timeline is not None else None
        self.transport = LayerwisePSWorker(self.args.rank, self.args.workers,
                                           [tuple(s) for s in servers], self.params,
                                           _config(self.args, overrides, tracer), priorities)
        self.transport.pull_ahead = self.args.pull_ahead
        return {"assignment": assignment.digest(), "plan": self.transport.digest.hex()}

    def step(self) -> dict:
        self.blocked_s = 0.0
        waited = run_queue_wait_s()
        started = time.time()
        with compute_priority(self.args.compute_rt):
            seconds = self.model.step()
        self.iteration_done()
        return {"seconds": seconds, "blocked_s": self.blocked_s, "start": started,
                **run_queue_fields(waited, run_queue_wait_s())}

    def iteration_done(self) -> None:
        """Backward has ended: ask for the next parameters (unless the first push did)."""
        self.transport.next_iteration()

    def run(self, iterations: int) -> dict:
        """`iterations` steps back to back (no driver round trip between them); each one's record."""
        steps = []
        for _ in range(int(iterations)):
            steps.append(self.step())
        return {"steps": steps}

    def scale(self, time_scale: float) -> dict:
        """Replay compute at `time_scale` x the profiled times from the next step on (calibration)."""
        if float(time_scale) <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.model.time_scale = float(time_scale)
        return {"time_scale": self.model.time_scale, "compute_s": self.model.compute_s}

    def compute(self, iterations: int) -> dict:
        """Compute only (no transport): the seconds of each of `iterations` replayed steps."""
        return compute_only(self, iterations)

    def drain(self) -> dict:
        self.transport.wait_all()
        self.transport.close()
        self.transport = None
        trace = _save_timeline(self.timeline)
        self.timeline = None
        return {"applied": applied_updates(self.params), "digest": params_digest(self.params),
                "threads": threading.active_count(), "trace": trace}


class ReplayedServer:
    """One server process: the full parameter list (its shards current) and the live server."""

    def __init__(self, args):
        self.args = args
        model = _replayed_model(args)
        self.ranking = model.profile.ranking()
        self.params = [model.parameters[p.name] for p in self.ranking]
        self.server: ParameterServer | None = None
        self.timeline: RankTimeline | None = None

    def listen(self, threshold: float, transport: dict | None = None, trace: str | None = None,
               applied: int | None = None) -> dict:
        """Serve with the classes of `threshold` (and `transport` settings) on a fresh port.

        `applied`: the updates every rank applied so far (checked at the last drain). A new shard
        plan (another policy or slice size) gives this server slices it did not hold, so every
        parameter is set to the value n applied updates give (-n * LEARNING_RATE everywhere).
        """
        overrides = _check_overrides(transport)
        if applied is not None:
            for tensor in self.params:
                tensor.fill_(-int(applied) * LEARNING_RATE)
        assignment, priorities = _priorities(self.ranking, threshold, self.args, overrides)
        self.timeline = RankTimeline(trace, f"server{self.args.index}") if trace else None
        tracer = self.timeline.transfer if self.timeline is not None else None
        self.server = ParameterServer(self.args.index, self.args.servers, self.args.workers, self.params,
                                      _config(self.args, overrides, tracer), ("0.0.0.0", 0), priorities,
                                      lr=LEARNING_RATE)
        return {"port": self.server.port, "assignment": assignment.digest(),
                "plan": self.server.digest.hex()}

    def drain(self) -> dict:
        self.server.serve_until_workers_leave(timeout=self.args.timeout)
        shards = []
        for (tensor_id, offset), value in self.server.values().items():
            self.params[tensor_id].view(-1)[offset:offset + value.numel()].copy_(value)
            shards.append(value)
        self.server.close()
        self.server = None
        trace = _save_timeline(self.timeline)
        self.timeline = None
        return {"applied": applied_updates(shards), "shards": len(shards), "threads": threading.active_count(),
                "trace": trace}


_WALL_OFFSET = time.time() - time.perf_counter()


def _wall(perf: float) -> float:
    """time.perf_counter() seconds as time.time() seconds (the timeline's clock)."""
    return perf + _WALL_OFFSET


def _save_timeline(timeline: RankTimeline | None) -> str | None:
    return timeline.save() if timeline is not None else None


def serve_commands(role, handlers: dict) -> None:
    """Answer one JSON command per stdin line until `exit` or end of input."""
    _reply(ok=True, event="ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            _reply(ok=True)
            return
        try:
            _reply(ok=True, **handlers[op](**command))
        except (GeryonError, KeyError, TypeError, ValueError) as exc:
            _reply(ok=False, error=f"{role} {op}: {type(exc).__name__}: {exc}")


def _rt_priority(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 99:
        raise argparse.ArgumentTypeError(f"{value}: 0 (normal scheduling) or a SCHED_RR priority 1..99")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geryon.bench.replay_roles")
    parser.add_argument("role", choices=("worker", "server", "ring"))
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--servers", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--size-scale", type=float, default=0.01)
    parser.add_argument("--metric", default="position")
    parser.add_argument("--within-class", choices=("fifo", "urgency"), default="fifo")
    parser.add_argument("--policy", default="geryon")
    parser.add_argument("--dscp", default="46,0")
    parser.add_argument("--slice-bytes", type=int, default=256 * 1024)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--spin-margin", type=float, default=SLEEP_MARGIN_S,
                        help="seconds of busy-wait at the end of each replayed layer (default 1 ms)")
    parser.add_argument("--congestion", default="", help="TCP congestion control (default: the system's)")
    parser.add_argument("--async-push", action="store_true",
                        help="push hooks overlap the next layers' compute (GPU-like) instead of delaying them")
    parser.add_argument("--class-thread-nice", type=int, default=0,
                        help="niceness added per class index to the flows' threads (TransportConfig)")
    parser.add_argument("--thread-rt", type=int, default=0,
                        help="SCHED_RR priority of the flows' threads, flow c at this - c (TransportConfig; 0 = off)")
    parser.add_argument("--compute-rt", type=_rt_priority, default=0, metavar="0..99",
                        help="SCHED_RR priority of the worker's replay thread while it steps (0 = normal "
                             "scheduling): the replayed compute stands for a GPU, so where the transport's "
                             "threads are real-time this keeps them from delaying it")
    parser.add_argument("--pull-ahead", action="store_true",
                        help="ask for the next parameters with the iteration's first push, not after the last")
    parser.add_argument("--job", type=int, default=4)
    return parser


def compute_only(worker, iterations: int) -> dict:
    """A replayed worker's `compute` command: `iterations` steps of its model with no transport (the
    worker's hooks see `offline`), at the compute threads' priority; their seconds and the nominal one."""
    worker.offline = True
    try:
        with compute_priority(worker.args.compute_rt):
            seconds = [worker.model.step() for _ in range(int(iterations))]
        return {"seconds": seconds, "nominal_s": worker.model.compute_s}
    finally:
        worker.offline = False


def main(argv=None) -> int:
    exit_without_collecting()   # a role imports torch: its exit need not collect torch's objects
    args = build_parser().parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # kill -USR1: every thread's stack in the log
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    torch.set_num_threads(1)
    try:
        if args.role in ("worker", "ring"):
            if args.role == "ring":
                from geryon.bench.replay_ddp import ReplayedDDPWorker

                worker = ReplayedDDPWorker(args)
            else:
                worker = ReplayedWorker(args)
            serve_commands("worker", {"connect": worker.connect, "step": worker.step,
                                      "run": worker.run, "compute": worker.compute, "scale": worker.scale,
                                      "drain": worker.drain})
        else:
            server = ReplayedServer(args)
            serve_commands("server", {"listen": server.listen, "drain": server.drain})
    except GeryonError as exc:
        print(f"geryon replay {args.role}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
