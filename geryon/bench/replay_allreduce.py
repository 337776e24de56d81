"""A replayed-model ring-allreduce job: its worker process and the driver that runs W of them.

    python -m geryon.bench.replay_allreduce worker --rank R --workers W --servers W --model resnet50 ...

    job = AllreduceJob(cluster, JobSpec(model="resnet50", workers=2), port=5460).start()
    job.connect({"policy": "geryon", "dscp": "46,0"})
    seconds, steps = job.run(10)
    job.drain()                   # every update applied exactly once on every rank, checked

The worker is a `ReplayedModel` (profiled per-layer compute, real tensors of the profiled sizes times
`--size-scale`) on an `AllreduceGroup` ring, driven like a data-parallel job's gradient hooks: layer l's
gradient is averaged across the ring as soon as its backward is done (`allreduce_async`, the tensor's
class and urgency from `threshold_split`, as the PS replay splits them), and layer l's forward in the next
iteration waits for that average and applies it. It speaks the command protocol of
`geryon.bench.replay_roles` (one JSON command per stdin line, one JSON reply per line):
    connect {threshold, peers: [[ip, port], ...], transport}   join the ring (every rank at once)
    run {iterations}   iterations back to back; each one's seconds (forward start to backward end) and
                       the time blocked on allreduces
    compute {iterations}   compute only, no ring
    drain    wait for the last allreduces, apply them, leave the ring; answers `applied` and the digest
    exit
Every gradient is 1.0 and its average across ranks is 1.0, applied by SGD at replay_roles'
LEARNING_RATE from 0: after n iterations every element is exactly -n * LEARNING_RATE on every rank, so
an allreduce lost, doubled or mis-summed shows up in `applied` at the drain.

The ring listens on fixed ports (`peers`), so the driver gives each connection fresh ones
(`AllreduceJob.connect`): a reconnect never waits for a closed listener's port.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time

import torch

from geryon import envvars
from geryon.quickexit import exit_without_collecting
from geryon.bench.paper_job import START_TIMEOUT_S, JobSpec, drain_check, run_steps
from geryon.bench.replay_roles import (GIL_SWITCH_INTERVAL_S, LEARNING_RATE, _check_overrides, _config, _priorities,
                                       _replayed_model, applied_updates, build_parser, compute_only, compute_priority,
                                       params_digest, run_queue_fields, run_queue_wait_s,
                                       serve_commands)
from geryon.bench.threshold import RoleProcess, gather_replies
from geryon.childproc import child_env, module_argv
from geryon.errors import ConfigError, GeryonError, TransportError
from geryon.transport import AllreduceGroup

MODULE = "geryon.bench.replay_allreduce"
PORTS_PER_JOB = 100      # connections per job before its ports wrap round (one per segment)


class ReplayedRingWorker:
    """One rank: the replayed model, its ring, and the allreduces in flight (per tensor)."""

    def __init__(self, args):
        self.args = args
        self.model = _replayed_model(args)
        self.ranking = self.model.profile.ranking()
        self.tensor_of = {p.name: index for index, p in enumerate(self.ranking)}
        self.params = [self.model.parameters[p.name] for p in self.ranking]
        self.group: AllreduceGroup | None = None
        self.priorities: list = []
        self.in_flight: dict[int, tuple] = {}     # tensor -> (work, gradient)
        self.blocked_s = 0.0
        self.offline = False
        self.model.add_pull_hook(self._before_forward)
        self.model.add_push_hook(self._after_backward)

    def _apply(self, tensor: int) -> None:
        work, gradient = self.in_flight.pop(tensor)
        work.wait()
        self.params[tensor].add_(gradient, alpha=-LEARNING_RATE)

    def _before_forward(self, _index, name) -> None:
        tensor = self.tensor_of.get(name)
        if tensor is not None and tensor in self.in_flight:
            entered = time.perf_counter()
            self._apply(tensor)
            self.blocked_s += time.perf_counter() - entered

    def _after_backward(self, _index, name, gradient) -> None:
        if self.offline:
            return
        tensor = self.tensor_of[name]
        work = self.group.allreduce_async([gradient], [self.priorities[tensor]], op="avg")
        self.in_flight[tensor] = (work, gradient)

    def connect(self, threshold: float, peers, transport: dict | None = None) -> dict:
        overrides = _check_overrides(transport)
        assignment, self.priorities = _priorities(self.ranking, threshold, self.args, overrides)
        rank = self.args.rank
        self.group = AllreduceGroup(rank, self.args.workers, [tuple(p) for p in peers],
                                    _config(self.args, overrides), listen=("0.0.0.0", peers[rank][1]))
        return {"assignment": assignment.digest()}

    def step(self) -> dict:
        self.blocked_s = 0.0
        waited = run_queue_wait_s()
        with compute_priority(self.args.compute_rt):
            seconds = self.model.step()
        return {"seconds": seconds, "blocked_s": self.blocked_s, **run_queue_fields(waited, run_queue_wait_s())}

    def run(self, iterations: int) -> dict:
        return {"steps": [self.step() for _ in range(int(iterations))]}

    def compute(self, iterations: int) -> dict:
        """Compute only (no ring): the seconds of each of `iterations` replayed steps."""
        return compute_only(self, iterations)

    def drain(self) -> dict:
        for tensor in sorted(self.in_flight):
            self._apply(tensor)
        self.group.close()
        self.group = None
        return {"applied": applied_updates(self.params), "digest": params_digest(self.params),
                "threads": threading.active_count()}


class AllreduceJob:
    """W replayed ring workers on the first W hosts of `cluster`; the PaperJob interface the tenants
    bench drives (start, connect, run, drain, stop). `port`: the first of this job's listening ports."""

    def __init__(self, cluster, spec: JobSpec, port: int):
        if len(cluster.hosts) < spec.workers:
            raise ConfigError(f"an allreduce job of {spec.workers} workers needs {spec.workers} hosts")
        if spec.workers < 2:
            raise ConfigError("an allreduce job needs at least 2 workers (a ring of one moves nothing)")
        self.cluster, self.spec, self.port = cluster, spec, port
        self.workers: list[RoleProcess] = []
        self.iterations = 0
        self.connections = 0
        self.checks: list[dict] = []
        self.connected = False
        self._log_dir = tempfile.mkdtemp(prefix="gy-ring-")

    def worker_host(self, rank: int) -> str:
        return self.cluster.hosts[rank].name

    def start(self) -> "AllreduceJob":
        env = child_env({envvars.JOB_SECRET: secrets.token_hex(16), "OMP_NUM_THREADS": "1"})
        role = module_argv(MODULE)
        extra = self.spec.role_args()
        for rank in range(self.spec.workers):
            self.workers.append(RoleProcess(self.cluster, self.worker_host(rank),
                                            [*role, "worker", "--rank", rank, *extra], env, self._log_dir))
        for process in self.workers:
            process.receive(timeout=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        for process in self.workers:
            process.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def connect(self, transport: dict) -> None:
        """Every rank joins a fresh ring with `transport` (policy, dscp, ...) on fresh ports."""
        if self.connected:
            raise TransportError("drain the previous segment before connecting again")
        port = self.port + self.connections % PORTS_PER_JOB
        self.connections += 1
        peers = [[self.cluster.host(self.worker_host(rank)).ip, port] for rank in range(self.spec.workers)]
        joined = gather_replies(self.workers, "connect", threshold=self.spec.threshold, peers=peers,
                                transport=transport)
        if len({reply["assignment"] for reply in joined}) != 1:
            raise TransportError("ranks disagree on the classes of the tensors")
        self.connected = True

    def run(self, iterations: int) -> tuple[list[float], list[list[dict]]]:
        self.iterations += iterations
        return run_steps(self.workers, iterations)

    def drain(self) -> None:
        """End the segment: every rank applied every iteration's average exactly once (checked)."""
        replies = gather_replies(self.workers, "drain")
        self.connected = False
        applied = [reply["applied"] for reply in replies]
        digests = {reply["digest"] for reply in replies}
        self.checks.append(drain_check(self.iterations, applied, digests))
        if not self.checks[-1]["ok"]:
            raise TransportError(f"after {self.iterations} iterations the ranks applied {applied} averages "
                                 f"({len(digests)} distinct digests): an allreduce was lost, doubled or mis-summed")


def main(argv=None) -> int:
    exit_without_collecting()   # a role imports torch: its exit need not collect torch's objects
    args = build_parser().parse_args(argv)
    if args.role != "worker":
        print("geryon replay allreduce: a ring has workers only", file=sys.stderr)
        return 2
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    torch.set_num_threads(1)
    try:
        worker = ReplayedRingWorker(args)
        serve_commands("worker", {"connect": worker.connect, "run": worker.run, "step": worker.step,
                                  "compute": worker.compute, "drain": worker.drain})
    except GeryonError as exc:
        print(f"geryon replay allreduce: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
