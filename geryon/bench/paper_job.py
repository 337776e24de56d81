"""The replayed job of `geryon bench paper`: W workers and W servers (PS) or a ring of W workers
(allreduce), policies switched live.

    job = PaperJob(cluster, JobSpec(model="vgg19", workers=8, layout="colocated", ...)).start()
    job.connect({"policy": "geryon", "slice_bytes": 40960})   # every rank, one policy
    seconds = job.run(6)          # per iteration, the slowest worker's seconds
    job.drain()                   # every update applied exactly once, checked
    job.set_rate(400_000_000)     # every port of the cluster re-shaped (same processes)

Collectives: "ps" (replay_roles' worker and server) or "allreduce" (replay_ddp's ring worker,
host i runs rank i, no servers; each segment's ring listens on a port of its own, RING_PORT_BASE up).

Layouts: "colocated" (the paper's 8 machines): host i runs worker i and server i, so a worker's
traffic to its own server stays inside the host (loopback) and each host's port carries its
worker's pushes and its server's parameters at once. "separate": servers on hosts of their own
(2W hosts).

The role processes (`replay_roles.py`) start once per model: importing torch in 16 processes on 2
cores takes ~20 s, so policies, slice sizes, TCP congestion control and the link rate all change
between segments without restarting them (drain, then reconnect with the new settings; the
plan digests every rank reports are compared). Iterations run back to back inside each worker
(`run`): no driver round trip between them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass

from geryon import envvars
from geryon.bench.paper_math import slowest_per_iteration
from geryon.bench.threshold import REPLAY_MODULE, RoleProcess, gather_replies
from geryon.categorize.replay import BENCH_SPIN_MARGIN_S
from geryon.childproc import child_env, module_argv
from geryon.errors import ConfigError, TransportError

LAYOUTS = ("colocated", "separate")
COLLECTIVES = ("ps", "allreduce")
RING_PORT_BASE = 29600     # segment k's ring listens on RING_PORT_BASE + k % RING_PORTS in every host
RING_PORTS = 2000
RUN_TIMEOUT_S = 600.0
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class JobSpec:
    model: str
    workers: int = 8
    layout: str = "colocated"
    batch: int = 32
    time_scale: float = 1.0          # replay time scale (compute_scale x wall_scale)
    size_scale: float = 0.01
    spin_margin: float = BENCH_SPIN_MARGIN_S
    timeout: float = 120.0
    threshold: float = 0.5           # used only when priority is "threshold"
    async_push: bool = True          # push hooks overlap compute (a GPU's async backward)
    pull_ahead: bool = False         # pull asked with the first push (MXNet KVStore's per-key pull)
    class_thread_nice: int = 0       # TransportConfig.class_thread_nice of every role
    thread_rt: int = 0        # TransportConfig.thread_rt_priority of every role
    compute_rt: int = 0       # SCHED_RR priority of the workers' replay (compute) thread; 0: normal
    nice: int = 0                    # scheduling niceness of the role processes (negative: ahead of others)
    collective: str = "ps"           # "ps" or "allreduce" (a ring of the workers, no servers)

    def __post_init__(self):
        if self.collective not in COLLECTIVES:
            raise ConfigError(f"collective {self.collective!r}: choose one of {', '.join(COLLECTIVES)}")
        if self.collective == "allreduce" and self.layout != "colocated":
            raise ConfigError("allreduce mode has no servers: use the colocated layout (one worker per host)")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout {self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if self.workers < 1:
            raise ConfigError("need at least one worker")

    @property
    def hosts(self) -> int:
        return self.workers if self.layout == "colocated" else 2 * self.workers

    def role_args(self) -> list:
        return ["--workers", self.workers, "--servers", self.workers, "--model", self.model,
                "--batch", self.batch, "--time-scale", self.time_scale, "--size-scale", self.size_scale,
                "--timeout", self.timeout, "--spin-margin", self.spin_margin,
                *(["--async-push"] if self.async_push else []),
                "--class-thread-nice", self.class_thread_nice, "--thread-rt", self.thread_rt,
                "--compute-rt", self.compute_rt,
                *(["--pull-ahead"] if self.pull_ahead else [])]


class PaperJob:
    """W servers and W replayed workers in the hosts of `cluster`."""

    def __init__(self, cluster, spec: JobSpec):
        if len(cluster.hosts) < spec.hosts:
            raise ConfigError(f"the {spec.layout} layout of {spec.workers} workers needs {spec.hosts} hosts")
        self.cluster, self.spec = cluster, spec
        self.servers: list[RoleProcess] = []
        self.workers: list[RoleProcess] = []
        self.iterations = 0
        self.checks: list[dict] = []
        self.connected = False
        self.segments = 0
        self._log_dir = tempfile.mkdtemp(prefix="gy-paper-")

    def server_host(self, index: int) -> str:
        return self.cluster.hosts[index if self.spec.layout == "colocated" else self.spec.workers + index].name

    def worker_host(self, rank: int) -> str:
        return self.cluster.hosts[rank].name

    @property
    def pids(self) -> list[int]:
        return [p.child.process.pid for p in self.servers + self.workers]

    def start(self) -> "PaperJob":
        env = child_env({envvars.JOB_SECRET: secrets.token_hex(16), "OMP_NUM_THREADS": "1"})
        role = module_argv(REPLAY_MODULE)
        if self.spec.nice:
            role = ["nice", "-n", str(self.spec.nice), *role]
        extra = self.spec.role_args()
        ring = self.spec.collective == "allreduce"
        for index in range(0 if ring else self.spec.workers):
            self.servers.append(RoleProcess(self.cluster, self.server_host(index),
                                            [*role, "server", "--index", index, *extra], env, self._log_dir))
        kind = "ring" if ring else "worker"
        for rank in range(self.spec.workers):
            self.workers.append(RoleProcess(self.cluster, self.worker_host(rank),
                                            [*role, kind, "--rank", rank, *extra], env, self._log_dir))
        for process in self.servers + self.workers:
            # "ready": imports done, tensors allocated (16 torch imports on 2 loaded cores: minutes)
            process.receive(timeout=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        for process in self.workers + self.servers:
            process.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    # -- settings -----------------------------------------------------------------------------
    def set_rate(self, rate: int) -> None:
        """Re-shape every port of the cluster at `rate` bits/s (priority queues kept)."""
        from geryon.netconf import install_priority_queues

        for link in self.cluster.topology.links:
            for end in (link.a, link.b):
                install_priority_queues(end.dev, self.cluster.classes, rate=rate, netns=end.netns)

    def set_time_scale(self, time_scale: float) -> None:
        gather_replies(self.workers, "scale", time_scale=time_scale)

    # -- segments -----------------------------------------------------------------------------
    def connect(self, transport: dict, trace_prefix: str | None = None) -> None:
        """Every server listens and every worker joins with `transport` (policy, slice_bytes, ...);
        with `trace_prefix` every rank records a timeline part next to it (merged by the caller)."""
        if self.connected:
            raise TransportError("drain the previous segment before connecting again")
        threshold = self.spec.threshold
        self.segments += 1
        if self.spec.collective == "allreduce":
            return self._connect_ring(transport, trace_prefix)
        for index, server in enumerate(self.servers):
            server.send("listen", threshold=threshold, transport=transport, trace=trace_prefix,
                        applied=self.iterations)
        listening = [server.receive() for server in self.servers]
        addresses = [[self.cluster.host(self.server_host(i)).ip, reply["port"]]
                     for i, reply in enumerate(listening)]
        for rank, worker in enumerate(self.workers):
            worker.send("connect", threshold=threshold, servers=addresses, transport=transport,
                        trace=trace_prefix)
        joined = [worker.receive() for worker in self.workers]
        plans = {reply["plan"] for reply in listening + joined}
        assignments = {reply["assignment"] for reply in listening + joined}
        if len(plans) != 1 or len(assignments) != 1:
            raise TransportError(f"ranks disagree on the shard plan or the classes: {sorted(plans)}")
        self.connected = True

    def _connect_ring(self, transport: dict, trace_prefix: str | None) -> None:
        port = RING_PORT_BASE + self.segments % RING_PORTS
        peers = [[self.cluster.host(self.worker_host(rank)).ip, port] for rank in range(self.spec.workers)]
        for worker in self.workers:   # every rank at once: each waits for its neighbours' connections
            worker.send("connect", threshold=self.spec.threshold, peers=peers, transport=transport,
                        trace=trace_prefix)
        joined = [worker.receive() for worker in self.workers]
        if len({(reply["plan"], reply["assignment"]) for reply in joined}) != 1:
            raise TransportError(f"ranks disagree on the bucket plan or the classes: {joined}")
        self.connected = True

    def run(self, iterations: int) -> tuple[list[float], list[dict]]:
        """`iterations` back-to-back steps on every worker: the slowest worker's seconds per step,
        and every worker's raw step records."""
        self.iterations += iterations
        return run_steps(self.workers, iterations)

    def drain(self) -> list[str]:
        """End the segment: every pushed update applied once everywhere (checked); trace parts."""
        workers = gather_replies(self.workers, "drain")
        servers = gather_replies(self.servers, "drain")
        self.connected = False
        applied = [reply["applied"] for reply in workers + servers]
        digests = {reply["digest"] for reply in workers}
        self.checks.append(drain_check(self.iterations, applied, digests))
        if not self.checks[-1]["ok"]:
            raise TransportError(f"after {self.iterations} iterations the ranks applied {applied} updates "
                                 f"({len(digests)} distinct worker digests): an update was lost or applied twice")
        return [reply["trace"] for reply in workers + servers if reply.get("trace")]

    def compute_only(self, iterations: int, rank: int = 0) -> dict:
        """One worker's replayed compute with no transport, alone (the others idle)."""
        return self.workers[rank].call("compute", iterations=iterations)

    def verification(self) -> dict:
        return {"drains": len(self.checks), "all_ok": all(c["ok"] for c in self.checks),
                "iterations": self.iterations}


def run_steps(workers, iterations: int) -> tuple[list[float], list[list[dict]]]:
    """`iterations` back-to-back steps on every replayed worker: the slowest worker's seconds per step,
    and every worker's raw step records."""
    for worker in workers:
        worker.send("run", iterations=iterations)
    replies = [worker.receive(timeout=RUN_TIMEOUT_S) for worker in workers]
    per_worker = [[step["seconds"] for step in reply["steps"]] for reply in replies]
    return slowest_per_iteration(per_worker), [reply["steps"] for reply in replies]


def drain_check(iterations: int, applied: list, digests: set) -> dict:
    """What a drain proves: every rank applied each of `iterations` updates once, the workers alike."""
    return {"iteration": iterations, "applied": applied,
            "ok": all(a == iterations for a in applied) and len(digests) == 1}


def role_cpu_seconds(pids) -> float:
    """User + system CPU seconds used so far by the processes `pids` (and their threads)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue
    return total
