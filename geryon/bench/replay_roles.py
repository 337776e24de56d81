"""The processes of a replayed-model PS job, driven one command at a time over stdin/stdout.

    python -m geryon.bench.replay_roles worker --rank R --workers W --model vgg19 ...
    python -m geryon.bench.replay_roles server --index S --servers M --workers W --model vgg19 ...

Each reads one JSON command per line on stdin and answers one JSON line on stdout
({"ok": true, ...} or {"ok": false, "error": "..."}); logs go to stderr. The driver
(`geryon.bench.threshold`) runs them inside the hosts of an emulated cluster.

A worker is a `ReplayedModel` (profiled per-layer compute, real tensors of the profiled sizes times
`--size-scale`) on a `PSWorker`: layer l's forward waits for layer l's pulled parameter
(`wait_param`), layer l's gradient is pushed as soon as its backward is done, and the pull of the
next version is requested when the backward pass ends. Commands:
    connect {threshold, servers: [[ip, port], ...]}  join the servers with the classes of
             threshold_split(ranking, [threshold]); answers the assignment digest
    step     one iteration; answers its seconds (forward start to backward end) and the time
             blocked on pulls
    drain    wait for the pulled parameters, leave the servers; answers the parameter digest and
             `applied` (see below)
    exit
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
import hashlib
import json
import os
import sys
import threading
import time

import torch

from geryon import envvars
from geryon.categorize.classes import threshold_split
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.replay import SLEEP_MARGIN_S, ReplayedModel
from geryon.errors import GeryonError
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


def _config(args) -> TransportConfig:
    return TransportConfig(secret=os.environ.get(envvars.JOB_SECRET, ""), job_id=args.job, policy=args.policy,
                           class_dscp=tuple(int(d) for d in args.dscp.split(",")),
                           slice_bytes=args.slice_bytes, timeout=args.timeout,
                           tcp_congestion=args.congestion or None)


def _replayed_model(args) -> ReplayedModel:
    # on 2 shared cores, W spinning workers starve the servers and the kernel's forwarding, so the
    # bench may spin less than the replay's default (--spin-margin)
    return ReplayedModel(resolve_profile(args.model, batch=args.batch), time_scale=args.time_scale,
                         size_scale=args.size_scale, gradient_value=1.0, spin_margin=args.spin_margin)


def _priorities(ranking, threshold: float, args):
    """The assignment for `threshold` and the transport's (class, urgency) per tensor.

    Within a class the send queues order by urgency ("urgency": end-host scheduling on top of the
    network's) or by arrival ("fifo": urgency 0 for all, the paper's Geryon, where only the
    network's priority queues reorder traffic, and the analytic model's assumption).
    """
    assignment = threshold_split(ranking, [threshold], metric=args.metric, max_classes=2)
    fifo = args.within_class == "fifo"
    return assignment, [(cls, 0 if fifo else index) for index, cls in enumerate(assignment.class_of)]


class LayerwisePSWorker(PSWorker):
    """A PSWorker pushed one tensor at a time (`push_tensor`, as each layer's backward ends)."""

    def next_iteration(self) -> None:
        """Every gradient of this iteration is pushed: ask for the next version of the parameters."""
        self.iteration += 1
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
        self.model.add_pull_hook(self._before_forward)
        self.model.add_push_hook(self._after_backward)

    def _before_forward(self, _index, name) -> None:
        tensor = self.tensor_of.get(name)
        if tensor is not None:
            entered = time.perf_counter()
            self.transport.wait_param(tensor)
            self.blocked_s += time.perf_counter() - entered

    def _after_backward(self, _index, name, gradient) -> None:
        self.transport.push_tensor(self.tensor_of[name], gradient)

    def connect(self, threshold: float, servers) -> dict:
        assignment, priorities = _priorities(self.ranking, threshold, self.args)
        self.transport = LayerwisePSWorker(self.args.rank, self.args.workers,
                                           [tuple(s) for s in servers], self.params,
                                           _config(self.args), priorities)
        return {"assignment": assignment.digest(), "plan": self.transport.digest.hex()}

    def step(self) -> dict:
        self.blocked_s = 0.0
        seconds = self.model.step()
        self.transport.next_iteration()
        return {"seconds": seconds, "blocked_s": self.blocked_s}

    def drain(self) -> dict:
        self.transport.wait_all()
        self.transport.close()
        self.transport = None
        return {"applied": applied_updates(self.params), "digest": params_digest(self.params),
                "threads": threading.active_count()}


class ReplayedServer:
    """One server process: the full parameter list (its shards current) and the live server."""

    def __init__(self, args):
        self.args = args
        model = _replayed_model(args)
        self.ranking = model.profile.ranking()
        self.params = [model.parameters[p.name] for p in self.ranking]
        self.server: ParameterServer | None = None

    def listen(self, threshold: float) -> dict:
        assignment, priorities = _priorities(self.ranking, threshold, self.args)
        self.server = ParameterServer(self.args.index, self.args.servers, self.args.workers, self.params,
                                      _config(self.args), ("0.0.0.0", 0), priorities, lr=LEARNING_RATE)
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
        return {"applied": applied_updates(shards), "shards": len(shards), "threads": threading.active_count()}


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geryon.bench.replay_roles")
    parser.add_argument("role", choices=("worker", "server"))
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
    parser.add_argument("--job", type=int, default=4)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    torch.set_num_threads(1)
    try:
        if args.role == "worker":
            worker = ReplayedWorker(args)
            serve_commands("worker", {"connect": worker.connect, "step": worker.step,
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
