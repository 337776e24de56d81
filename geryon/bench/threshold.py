"""The threshold search measured for real: replayed models over the transport on an emulated cluster.

    setup = default_setup("vgg19", workers=2, servers=1)   # or EmulatedSetup(...) with every field
    record = run_emulated_threshold_bench(setup, SearchSettings())   # RUN.json data

What runs: an `EmulatedCluster` of M + W hosts (star, every port shaped at `setup.link_rate` with
strict-priority queues for 2 classes: DSCP 46 high, 0 low), a parameter server on each of the first
M hosts and a replayed worker on each of the next W (`replay_roles.py`, `geryon` policy: one TCP
flow per class, marked with its DSCP). `ReplayedPSJob.measure_iteration(threshold)` runs one
synchronous iteration on every worker and returns the slowest worker's seconds; when the threshold
differs from the previous iteration's it first switches every rank to threshold_split(ranking, [t])
at that iteration boundary (drain, reconnect, digests compared; see `replay_roles.py`). That is all
`geryon.bench.sweep.run_threshold_bench` needs for the search, the sweep and the re-measurement.

Scaling (why a 2-core machine can stand for the paper's cluster): an iteration's shape is set by the
ratio of compute time to transfer time. Compute is replayed at `time_scale` x the profiled GPU times,
tensors have `size_scale` x the profiled bytes, and every emulated port runs at
`link_rate = bandwidth * size_scale / time_scale`, so each transfer takes time_scale x its time at
`bandwidth` with full sizes: the same ratio (10 Gbit/s with full sizes = 100 Mbit/s with sizes / 100).
`bandwidth` is the paper-scale rate of every port; W workers share a server's port, so each gets
bandwidth x M / W. `default_setup` picks per model where the threshold matters (PAPER_SETTINGS):
VGG-19 20 Gbit/s per worker at time_scale 1 (2 workers, 1 server: 400 Mbit/s ports, 5.7 MB per
worker per direction), ResNet-50 10 Gbit/s per worker at time_scale 2 (100 Mbit/s ports, 1 MB).
size_scale stays 1/100: smaller sizes make TCP start-up and per-frame overhead, not bandwidth, the
cost; ResNet-50 runs at twice the profiled times because its 107 layers of ~1 ms replay with
~0.1 ms jitter each and the replay spins below 1 ms. Slices are 64 KiB (6.4 MB at paper scale).
With the CLI's emulated defaults (12 iterations per probe, 2 warm-up; 8 before, see below) and
`--sweep-passes 2` a run -- 10 search probes, 2 passes over the 21 candidates and the coarse split,
10 race passes over up to 5 contenders, the re-measured choice: ~1,260 iterations and ~105
switches -- takes about 7 minutes for ResNet-50 with 4 workers.

Send order inside a class (`within_class`): "fifo" (default) gives every tensor urgency 0, so each
class's send queue is first come first served and only the network's priority queues reorder
traffic -- the paper's Geryon and the analytic model's assumption. "urgency" keeps the transport's
end-host urgency order inside each class (P3/TicTac-style on top of Geryon); measured: it makes
VGG-19's curve flat (0.34-0.37 s over all thresholds at 2 workers, within the ~4% noise), because the
end host already sends the urgent layers first and the threshold has nothing left to decide.

Iteration time: a worker's forward start to backward end, its forward blocked on pulls. After a
switch the first iteration runs on parameters pulled before it (pure compute) and the second carries
the first transfers on the new connections (TCP start-up; measured 5-10% slower than the rest), so
the emulated backend discards 2 warm-up iterations per probe. The driver's per-iteration round trip
(~1 ms) overlaps with the pulls. Per-iteration noise on a shared 2-core machine, 4 workers: the
median deviation from a probe's median is 1.6-2.1% for VGG-19 (it follows the machine's load) and
4.5-5.4% for ResNet-50 (whatever the load: 11-13% of its iterations are compute-only, their
parameters having arrived before the forward pass: with bbr the server port's egress shares swing
between the four workers' pulls, the workers' ends spread, their pushes arrive spread out and the
next iteration barely waits; `python -m geryon.bench.threshold_phase`), `extra.iteration_noise`;
hence 12 iterations per probe, the race after the sweep (`SweepRace`: the choice and the nearest
contenders timed over 12 probes each, trimmed mean, bootstrap intervals), and `extra.sweep_ratio`
(the sweep's own time at the chosen threshold over its best) next to `ratio` (a fresh
re-measurement over the smallest of many noisy estimates, biased low). Each worker's
run-queue wait per iteration (`extra.worker_waits`, `run_wait_share`) and the load average at every
switch say how much CPU contention went into a run (docs/threshold-search.md).

Measured runs: docs/results/.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass

from geryon import envvars
from geryon.childproc import ChildProcess, child_env, module_argv
from geryon.errors import ConfigError, TransportError
from geryon.signals import sigterm_as_interrupt

REPLAY_MODULE = "geryon.bench.replay_roles"
REPLY_TIMEOUT_S = 120.0


# Per model: (paper-scale bandwidth per worker, time_scale) where the threshold matters. The analytic
# model (categorize/model.py) puts VGG-19's best threshold 11% below the worst at 20 Gbit/s per worker,
# ResNet-50's 25% at 10 Gbit/s (at 20 Gbit/s it is compute-bound and flat). ResNet-50's 107 layers
# of ~1 ms replay with less relative jitter at twice the profiled times.
PAPER_SETTINGS = {"vgg19": (20e9, 1.0), "resnet50": (10e9, 2.0)}
DEFAULT_PAPER_SETTING = (20e9, 1.0)
# Per model: the replay's busy-wait at the end of each layer (None: the replay's 1 ms). ResNet-50's
# layers last ~1 ms at time_scale 2, so with 1 ms every replayed worker spins through its whole
# compute: 4 workers demand ~2.6 cores of a 2-core machine, and the slowest worker's replay thread
# waited for a CPU 45% of its iteration (schedstat, `run_wait_share`); 0.2 ms cut that to ~15%
# (docs/threshold-search.md). Sleeping more is as precise: the replay's deadlines chain, so a late
# wake-up is taken back from the next layer instead of adding up.
SPIN_MARGINS = {"resnet50": 0.0002}


def default_setup(model: str, workers: int = 2, servers: int = 1, bandwidth: float | None = None,
                  time_scale: float | None = None, spin_margin: float | None = None,
                  **fields) -> "EmulatedSetup":
    """An EmulatedSetup with the model's per-worker paper bandwidth (port rate = it x workers / servers)."""
    key = model.lower().replace("-", "")
    per_worker, model_time_scale = PAPER_SETTINGS.get(key, DEFAULT_PAPER_SETTING)
    if bandwidth is None:
        bandwidth = per_worker * max(1.0, workers / max(1, servers))
    return EmulatedSetup(model=model, workers=workers, servers=servers, bandwidth=bandwidth,
                         time_scale=model_time_scale if time_scale is None else time_scale,
                         spin_margin=SPIN_MARGINS.get(key) if spin_margin is None else spin_margin, **fields)


@dataclass(frozen=True)
class EmulatedSetup:
    """What to emulate, as plain data (stored in RUN.json's context)."""

    model: str = "vgg19"
    workers: int = 2
    servers: int = 1
    bandwidth: float = 40e9      # bits/s of every port at paper scale
    size_scale: float = 0.01
    time_scale: float = 1.0
    metric: str = "position"
    within_class: str = "fifo"   # send order inside a class: "fifo" (the paper's) or "urgency"
    batch: int = 32
    slice_bytes: int = 64 * 1024
    timeout: float = 60.0
    congestion: str = ""         # TCP congestion control of the transport ("" = the system's, bbr here)
    spin_margin: float | None = None   # replay busy-wait per layer, seconds (None: replay's 1 ms)

    def __post_init__(self):
        if self.workers < 1 or self.servers < 1:
            raise ConfigError("need at least one worker and one server")
        if self.workers + self.servers > 64:
            raise ConfigError("at most 64 emulated hosts (workers + servers)")
        if self.within_class not in ("fifo", "urgency"):
            raise ConfigError(f"within_class must be fifo or urgency, got {self.within_class!r}")
        if not 0 < self.size_scale <= 1 or self.time_scale <= 0 or self.bandwidth <= 0:
            raise ConfigError("need 0 < size_scale <= 1, time_scale > 0 and bandwidth > 0")

    @property
    def link_rate(self) -> int:
        """Bits/s of every emulated port: the paper's bandwidth scaled like sizes and times."""
        return int(round(self.bandwidth * self.size_scale / self.time_scale))

    def role_args(self) -> list[str]:
        return ["--workers", self.workers, "--servers", self.servers, "--model", self.model,
                "--batch", self.batch, "--time-scale", self.time_scale, "--size-scale", self.size_scale,
                "--metric", self.metric, "--within-class", self.within_class,
                "--slice-bytes", self.slice_bytes, "--timeout", self.timeout, "--congestion", self.congestion,
                *(["--spin-margin", self.spin_margin] if self.spin_margin is not None else [])]


class RoleProcess:
    """One replay role in a host: JSON commands in on stdin, one JSON reply per command out."""

    def __init__(self, cluster, host: str, argv: list[str], env: dict, log_dir: str):
        self.host = host
        role = argv[argv.index("-m") + 2]   # python -u -m MODULE ROLE ...
        self.name = f"{role}@{host}"
        self.child = ChildProcess.start(argv, netns=cluster.host(host).netns, env=env, interactive=True,
                                        name=self.name, error=TransportError,
                                        stderr_path=os.path.join(log_dir, f"{role}-{host}.log"))

    def send(self, op: str, **fields) -> None:
        self.child.send({"op": op, **fields})

    def receive(self, timeout: float = REPLY_TIMEOUT_S) -> dict:
        reply = self.child.next_record(timeout)
        if not reply.get("ok"):
            raise TransportError(f"{reply.get('error')} ({self.child.stderr_tail()})")
        return reply

    def call(self, op: str, **fields) -> dict:
        self.send(op, **fields)
        return self.receive()

    def stop(self) -> None:
        if self.child.running():
            try:
                self.send("exit")
                self.child.process.wait(timeout=10)
            except (TransportError, subprocess.TimeoutExpired):
                pass
        self.child.close()


def gather_replies(processes, op: str, **fields) -> list[dict]:
    """Send a command to every process at once, then collect the replies in order."""
    for process in processes:
        process.send(op, **fields)
    return [process.receive() for process in processes]


class ReplayedPSJob:
    """M servers and W replayed workers in the hosts of `cluster`, one iteration per call.

    `ranking` is the urgency ranking of `setup.model`'s profile, the one the role processes split.
    """

    def __init__(self, cluster, setup: EmulatedSetup, ranking):
        self.cluster, self.setup = cluster, setup
        self.ranking = ranking
        self.iterations = 0               # iterations run by every worker so far
        self.threshold: float | None = None
        self.switches: list[dict] = []
        self.checks: list[dict] = []      # one per drain: applied updates vs iterations
        self.worker_times: list[list[float]] = []
        self.worker_waits: list[list[float | None]] = []   # per iteration: each worker's run-queue wait
        self.servers: list[RoleProcess] = []
        self.workers: list[RoleProcess] = []
        self._log_dir = tempfile.mkdtemp(prefix="gy-replay-")

    def start(self) -> "ReplayedPSJob":
        env = child_env({envvars.JOB_SECRET: secrets.token_hex(16), "OMP_NUM_THREADS": "1"})
        role = module_argv(REPLAY_MODULE)
        extra = self.setup.role_args()
        hosts = [h.name for h in self.cluster.hosts]
        for index in range(self.setup.servers):
            self.servers.append(RoleProcess(self.cluster, hosts[index],
                                            [*role, "server", "--index", index, *extra], env, self._log_dir))
        for rank in range(self.setup.workers):
            self.workers.append(RoleProcess(self.cluster, hosts[self.setup.servers + rank],
                                            [*role, "worker", "--rank", rank, *extra], env, self._log_dir))
        for process in self.servers + self.workers:
            process.receive()             # "ready": imports done, tensors allocated
        return self

    def finish(self) -> None:
        """Drain once more so that the last segment's updates are checked too."""
        if self.threshold is not None:
            self._drain()
            self.threshold = None

    def stop(self) -> None:
        """End every role process (after `finish`, or at once after a failure), remove their logs."""
        for process in self.workers + self.servers:
            process.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    # -- the iteration ------------------------------------------------------------------------------
    def measure_iteration(self, threshold: float) -> float:
        """Run one iteration with threshold `threshold` on every worker; the slowest worker's seconds."""
        threshold = float(threshold)
        if threshold != self.threshold:
            self.switch(threshold)
        replies = gather_replies(self.workers, "step")
        self.iterations += 1
        times = [reply["seconds"] for reply in replies]
        self.worker_times.append(times)
        self.worker_waits.append([reply.get("run_wait_s") for reply in replies])
        return max(times)

    def switch(self, threshold: float) -> None:
        """Take every rank to threshold_split(ranking, [threshold]) at this iteration boundary."""
        from geryon.categorize.classes import threshold_split

        started = time.perf_counter()
        if self.threshold is not None:
            self._drain()
        expected = threshold_split(self.ranking, [threshold], metric=self.setup.metric).digest()
        listening = gather_replies(self.servers, "listen", threshold=threshold)
        addresses = [[self.cluster.host(process.host).ip, reply["port"]]
                     for process, reply in zip(self.servers, listening)]
        joined = gather_replies(self.workers, "connect", threshold=threshold, servers=addresses)
        digests = {reply["assignment"] for reply in listening + joined}
        plans = {reply["plan"] for reply in listening + joined}
        if digests != {expected} or len(plans) != 1:
            raise TransportError(f"ranks disagree on the assignment for t={threshold:g}: "
                                 f"{sorted(digests)} vs {expected} (plans {sorted(plans)})")
        self.threshold = threshold
        self.switches.append({"iteration": self.iterations, "threshold": threshold,
                              "assignment_digest": expected,
                              "switch_s": time.perf_counter() - started, "loadavg": load_average()})

    def _drain(self) -> None:
        """Every update pushed so far is applied and pulled back; check it on every rank."""
        workers = gather_replies(self.workers, "drain")
        servers = gather_replies(self.servers, "drain")
        applied = [reply["applied"] for reply in workers + servers]
        worker_digests = {reply["digest"] for reply in workers}
        check = {"iteration": self.iterations, "applied": applied,
                 "threads": [reply.get("threads") for reply in workers + servers],
                 "ok": all(a == self.iterations for a in applied) and len(worker_digests) == 1}
        self.checks.append(check)
        if not check["ok"]:
            raise TransportError(f"after {self.iterations} iterations the ranks applied {applied} updates "
                                 f"({len(worker_digests)} distinct worker parameter digests): an update was "
                                 "lost or applied twice")

    def verification(self) -> dict:
        """What the drains found: every rank applied every update exactly once at every switch."""
        return {"drains": len(self.checks), "all_ok": all(c["ok"] for c in self.checks),
                "final_applied": self.checks[-1]["applied"] if self.checks else None,
                "iterations": self.iterations}


def load_average() -> float | None:
    """The machine's 1-minute load average (other work sharing the cores), None if unreadable."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def contention_summary(worker_times, worker_waits) -> dict:
    """How much of each iteration the workers spent waiting for a CPU (schedstat run-queue delay).

    `run_wait_share`: median over iterations of (the slowest worker's replay-thread run-queue wait
    / its iteration time); `run_wait_p90_share` the 90th percentile. On a cluster emulated on a few
    shared cores this is the CPU contention inside the measurement: replayed compute that could
    not run when it should have.
    """
    import numpy as np

    shares = []
    for times, waits in zip(worker_times, worker_waits):
        if not times or any(w is None for w in waits):
            continue
        slowest = int(np.argmax(times))
        if times[slowest] > 0:
            shares.append(waits[slowest] / times[slowest])
    if not shares:
        return {}
    return {"run_wait_share": float(np.median(shares)), "run_wait_p90_share": float(np.percentile(shares, 90))}


def noise_summary(record: dict) -> dict:
    """How noisy single iterations were, and the sweep's robust fit at the chosen threshold.

    `chosen_iter_s` is a fresh re-measurement while `sweep_best_iter_s` is the smallest of many noisy
    medians (biased low); `sweep_ratio` (from the bench) compares like with like: the sweep at the
    chosen threshold over the sweep's best; `sweep_fit_ratio` does the same on the robust fit of
    the whole sweep. `iteration_noise` is the median relative deviation of the kept iterations from
    their probe's median (per pass of the sweep).
    """
    import numpy as np

    sweep = record.get("sweep") or []
    settings = record["settings"]
    warmup, length = settings["warmup"], settings["iters_per_probe"]

    def kept(point):
        times = point["times"]
        return [t for start in range(0, len(times), length) for t in times[start + warmup:start + length]]

    deviations = []
    for point in sweep:
        for start in range(0, len(point["times"]), length):
            chunk = point["times"][start + warmup:start + length]
            if chunk:
                middle = float(np.median(chunk))
                deviations += [abs(t / middle - 1) for t in chunk if middle]
    summary = {"iteration_noise": float(np.median(deviations)) if deviations else None}
    if sweep and any(p["threshold"] == record["chosen"] for p in sweep):
        from geryon.categorize.fit import fit_threshold_curve

        fit = fit_threshold_curve({p["threshold"]: kept(p) for p in sweep}, settings["smoothing"])
        summary.update(sweep_fit_best=fit.minimum, sweep_fit_best_s=fit.minimum_s,
                       sweep_fit_ratio=float(fit.predict([record["chosen"]])[0]) / fit.minimum_s)
    return summary


def cluster_name() -> str:
    return "r" + uuid.uuid4().hex[:5]


def run_emulated_threshold_bench(setup: EmulatedSetup, settings=None, name: str | None = None,
                                 sweep_passes: int = 3, seed: int = 0, race=None) -> dict:
    """Search, sweep and re-measure on a fresh emulated cluster; return the RUN.json record."""
    from geryon.bench.sweep import coarse_threshold, profile_context, run_threshold_bench
    from geryon.categorize.profiles import resolve_profile
    from geryon.categorize.search import SearchSettings
    from geryon.emulate import EmulatedCluster

    settings = settings or SearchSettings()
    profile = resolve_profile(setup.model, batch=setup.batch)
    started = time.perf_counter()
    load_at_start = load_average()
    context = profile_context(profile, setup.metric, backend="emulated", bandwidth_bps=setup.bandwidth,
                              link_rate_bps=setup.link_rate, workers=setup.workers, servers=setup.servers,
                              emulation=asdict(setup), policy="geryon")
    # a SIGTERM (kill, a CI timeout) tears the cluster and the role processes down like Ctrl-C
    with sigterm_as_interrupt(), EmulatedCluster(name or cluster_name(),
                                                 hosts=setup.servers + setup.workers,
                                                 bw=setup.link_rate, priority=True) as cluster:
        job = ReplayedPSJob(cluster, setup, profile.ranking())
        try:
            job.start()
            record = run_threshold_bench(job.measure_iteration, settings, context, sweep=True,
                                         sweep_passes=sweep_passes, seed=seed, race=race,
                                         references={"coarse": coarse_threshold(profile, setup.metric)})
            job.finish()
        finally:
            job.stop()
    extra = record["extra"]
    extra.update(noise_summary(record))
    extra["verification"] = job.verification()
    extra["switches"] = job.switches
    extra["worker_times"] = job.worker_times
    extra["worker_waits"] = job.worker_waits
    extra.update(contention_summary(job.worker_times, job.worker_waits))
    extra["loadavg_start"], extra["loadavg_end"] = load_at_start, load_average()
    extra["wall_s"] = time.perf_counter() - started
    return record
