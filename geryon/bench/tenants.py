"""`geryon bench tenants`: two or three replayed jobs and a background flow sharing one emulated fabric.

    record = run_tenants_bench(TenantSettings(models=("vgg19", "resnet50")), progress=print)

A job is `MODEL` or `MODEL:ps` (a replayed PS job, `paper_job.PaperJob`, "separate" layout: workers on
h1..hW, servers on h(W+1)..h(2W)) or `MODEL:allreduce` (a replayed ring allreduce job,
`replay_allreduce.AllreduceJob`, its ranks on h1..hW). All jobs' workers are on the same hosts, so PS
pulls and the ring's transfers meet on the switch ports toward the workers. A background bulk flow (a
checkpoint upload or a dataset reader: `geryon.emulate.traffic`) from one more host into h1 shares the
same port. Every egress carries the fabric classes (`geryon.netconf.tenants`,
installed by `geryon.emulate.fabric_classes`). Policies, the order rotated per repetition:

    vanilla         whole tensors, one unmarked FIFO flow per peer; background unmarked
    endhost         each job's sender-side priority (urgent slices first), unmarked; background unmarked
    fabric          geryon: every job's urgent class on the fabric's urgent DSCP, bulk on 0; background CS1
    fabric+weights  fabric classes with job weights: the job losing most GPU time per byte delayed (its
                    compute per iteration over its bytes per iteration, Crux's GPU intensity) gets the
                    strict urgent level, the others weighted levels below it

The emulated links run without segmentation offload (`offload=False`): with it, TCP hands 64 KB
super-packets to the queues and HTB's round robin serves one packet per class per turn whatever its
size, so the bulk and background classes split a port about evenly instead of by their weights.

Per policy and job: the median iteration time (the slowest worker's per iteration) and GPU-time
utilisation (compute seconds / wall seconds summed over the job's workers); in aggregate, the same sum
over every job; the background flow's goodput, against its guaranteed floor (background_percent of the
link). Iteration times here are CPU-bound on a loaded machine as well as network-bound: the record
keeps the load average before and after each run.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
import uuid
from dataclasses import asdict, dataclass

from geryon.bench.paper_job import JobSpec, PaperJob
from geryon.bench.replay_allreduce import PORTS_PER_JOB, AllreduceJob
from geryon.bench.threshold import load_average
from geryon.emulate.cluster import EmulatedCluster
from geryon.emulate.fabric_classes import install_profile
from geryon.emulate.traffic import traffic_argv
from geryon.errors import ConfigError
from geryon.netconf.tenants import (BACKGROUND_DSCP, BACKGROUND_PERCENT, Tenant, Tenants, tenant_class_spec,
                                    tenant_profile)
from geryon.sim.jobs import TRANSPORT_POLICY

POLICIES = ("vanilla", "endhost", "fabric", "fabric+weights")
KINDS = ("ps", "allreduce")
MAX_JOBS = 3
RING_PORT = 5400        # allreduce job i listens on RING_PORT + i * PORTS_PER_JOB + its connection count
SINK_PORT = 5399
BACKGROUND_SECONDS = 3600  # the sender runs until the segment ends; the sink's count is the measure
CONNECT_TIMEOUT_S = 60.0
# A job's transport per policy (replay_roles' TRANSPORT_OVERRIDES), the one the simulator models each policy
# with; "dscp" is set per job for fabric ones.
POLICY_TRANSPORT = {policy: {"policy": TRANSPORT_POLICY[policy]} for policy in POLICIES}


@dataclass(frozen=True)
class TenantSettings:
    models: tuple[str, ...] = ("vgg19", "resnet50:allreduce")   # MODEL[:ps|:allreduce], one job each
    workers: int = 2                 # per job
    rate: str = "200mbit"            # every emulated link
    size_scale: float = 0.01
    time_scale: float = 1.0
    iterations: int = 10
    warmup: int = 2
    repetitions: int = 1
    background_percent: int = BACKGROUND_PERCENT
    background: bool = True
    policies: tuple[str, ...] = POLICIES
    offload: bool = False            # GSO/TSO on the emulated links (the module docstring says why not)

    def __post_init__(self):
        if not 1 <= len(self.models) <= MAX_JOBS:
            raise ConfigError(f"give 1 to {MAX_JOBS} models (one job each), got {len(self.models)}")
        unknown = sorted(set(self.policies) - set(POLICIES))
        if unknown:
            raise ConfigError(f"unknown policies {', '.join(unknown)}: choose from {', '.join(POLICIES)}")
        if self.workers < 1 or self.iterations < 1 or self.repetitions < 1 or self.warmup < 0:
            raise ConfigError("workers, iterations and repetitions must be at least 1, warmup at least 0")
        kinds = [job_kind(text)[1] for text in self.models]
        if "allreduce" in kinds and self.workers < 2:
            raise ConfigError("an allreduce job needs at least 2 workers: give --workers 2 or more")

    @property
    def hosts(self) -> int:
        """Workers (shared by every job), PS servers (when a job is a PS job), one background sender."""
        ps = any(job_kind(text)[1] == "ps" for text in self.models)
        return (2 if ps else 1) * self.workers + 1


def job_kind(text: str) -> tuple[str, str]:
    """'vgg19' or 'vgg19:ps' -> ('vgg19', 'ps'); 'resnet50:allreduce' -> ('resnet50', 'allreduce')."""
    model, _, kind = text.partition(":")
    kind = kind or "ps"
    if kind not in KINDS or not model:
        raise ConfigError(f"job {text!r}: give MODEL, MODEL:ps or MODEL:allreduce")
    return model, kind


def job_names(models) -> list[str]:
    return [f"{model}-{kind}-{index}" for index, (model, kind) in enumerate(map(job_kind, models))]


def gpu_intensity(compute_s: float, model_bytes: float) -> float:
    """Crux's job weight: GPU seconds per iteration over bytes per iteration (per byte delayed)."""
    return compute_s / max(model_bytes, 1.0)


def fabric_tenants(names, weights, background_percent: int, weighted: bool) -> Tenants:
    return Tenants("bench", tuple(Tenant(n, w if weighted else 1.0) for n, w in zip(names, weights)),
                   background_percent)


def utilisation(compute_s: list[float], steps: list[list[dict]]) -> dict:
    """compute / wall summed over workers: sum_w(iterations * compute_w) / sum_w(sum of step seconds)."""
    compute = sum(c * len(s) for c, s in zip(compute_s, steps))
    wall = sum(step["seconds"] for worker in steps for step in worker)
    return {"compute_s": compute, "wall_s": wall, "utilisation": compute / wall if wall else 0.0}


def _step_values(steps: list[list[dict]], key: str) -> list:
    """`key` of every worker's every step that has it (the run-queue fields need /proc schedstat)."""
    return [step[key] for worker in steps for step in worker if key in step]


def cpu_wait(steps: list[list[dict]]) -> float | None:
    """Seconds per iteration a job's replay thread was runnable but waiting for a CPU (the workers' mean;
    None where /proc schedstat is missing): the share of an iteration the emulation's shared cores add."""
    waits = _step_values(steps, "run_wait_s")
    return statistics.mean(waits) if waits else None


def wake_wait(steps: list[list[dict]], threads: str = "") -> float | None:
    """Seconds one wake-up of a job's replay thread (`threads` "_all": any of its threads) waited for a
    CPU: the run-queue wait over the times scheduled in, pooled over workers and iterations (None where
    the steps do not count schedulings)."""
    counted = [step for worker in steps for step in worker if f"run_schedulings{threads}" in step]
    schedulings = sum(step[f"run_schedulings{threads}"] for step in counted)
    return sum(step[f"run_wait{threads}_s"] for step in counted) / schedulings if schedulings else None


def _mean_schedulings(steps: list[list[dict]]) -> float | None:
    counts = _step_values(steps, "run_schedulings")
    return statistics.mean(counts) if counts else None


class TenantsBench:
    """One emulated cluster, the jobs' role processes started once, segments per policy."""

    def __init__(self, settings: TenantSettings, progress=None):
        self.s = settings
        self.progress = progress or (lambda _line: None)
        self.names = job_names(settings.models)
        self.cluster = None
        self.jobs: list[PaperJob | AllreduceJob] = []
        self.compute_s: list[list[float]] = []
        self.weights: list[float] = []

    @property
    def background_host(self) -> str:
        return f"h{self.s.hosts}"

    def start(self) -> None:
        s = self.s
        self.cluster = EmulatedCluster("n" + uuid.uuid4().hex[:5], hosts=s.hosts, bw=s.rate,
                                       ack_priority="off", offload=s.offload)
        self.cluster.up()   # held before it is built: stop() removes it even when up() is interrupted
        for index, (model, kind) in enumerate(map(job_kind, s.models)):
            spec = JobSpec(model=model, workers=s.workers, layout="separate", time_scale=s.time_scale,
                           size_scale=s.size_scale)
            if kind == "ps":
                self.jobs.append(PaperJob(self.cluster, spec).start())
                self.progress(f"job {model} (PS): {s.workers} workers, {s.workers} servers started")
            else:
                port = RING_PORT + index * PORTS_PER_JOB
                self.jobs.append(AllreduceJob(self.cluster, spec, port).start())
                self.progress(f"job {model} (ring allreduce): {s.workers} workers started")
        for job in self.jobs:
            nominal = [worker.call("compute", iterations=1)["nominal_s"] for worker in job.workers]
            self.compute_s.append(nominal)
        for job, nominal in zip(self.jobs, self.compute_s):
            self.weights.append(gpu_intensity(statistics.mean(nominal), _model_bytes(job.spec)))

    def stop(self) -> None:
        for job in self.jobs:
            job.stop()
        if self.cluster is not None:
            self.cluster.down()

    def segment(self, policy: str) -> dict:
        """Every job connected with `policy`, the background flow on, iterations run at once."""
        s = self.s
        weighted = policy == "fabric+weights"
        tenants = fabric_tenants(self.names, self.weights, s.background_percent, weighted)
        install_profile(self.cluster, tenant_profile(tenants))
        fabric = policy.startswith("fabric")
        for name, job in zip(self.names, self.jobs):
            transport = dict(POLICY_TRANSPORT[policy])
            dscps = tenant_class_spec(tenants, name) if fabric else "high:0,low:0"
            transport["dscp"] = ",".join(part.split(":")[1] for part in dscps.split(","))
            job.connect(transport)
        if s.warmup:
            _run_all(self.jobs, s.warmup)
        background = self._background_start(BACKGROUND_DSCP if fabric else 0) if s.background else None
        started = time.monotonic()
        steps = _run_all(self.jobs, s.iterations)
        elapsed = time.monotonic() - started
        goodput = self._background_stop(background) if background else None
        for job in self.jobs:
            job.drain()
        jobs = []
        for name, job_steps, compute in zip(self.names, steps, self.compute_s):
            slowest = [max(worker[i]["seconds"] for worker in job_steps) for i in range(s.iterations)]
            jobs.append({"job": name, "median_iteration_s": statistics.median(slowest),
                         **utilisation(compute, job_steps), "cpu_wait_s": cpu_wait(job_steps),
                         "wake_wait_s": wake_wait(job_steps), "wake_wait_all_s": wake_wait(job_steps, "_all"),
                         "wakeups": _mean_schedulings(job_steps),
                         "classes": tenant_class_spec(tenants, name) if fabric else "unmarked"})
        compute = sum(j["compute_s"] for j in jobs)
        wall = sum(j["wall_s"] for j in jobs)
        rate = self.cluster.rate
        return {"policy": policy, "jobs": jobs, "aggregate_utilisation": compute / wall if wall else 0.0,
                "background_bps": goodput, "background_share": None if goodput is None else goodput / rate,
                "background_floor": s.background_percent / 100 if fabric else None, "seconds": elapsed}

    def _background_start(self, dscp: int):
        sink = self.cluster.popen("h1", traffic_argv("sink", "--port", str(SINK_PORT)), stdout=-1, text=True)
        if json.loads(sink.stdout.readline()).get("event") != "listening":
            raise ConfigError("the background sink did not start")
        sender = self.cluster.popen(self.background_host, traffic_argv(
            "bulk", self.cluster.host("h1").ip, "--port", str(SINK_PORT), "--duration", str(BACKGROUND_SECONDS),
            "--dscp", str(dscp)), stdout=-1, stderr=-1, text=True)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not self._background_connected():  # a Python start in a namespace takes seconds when loaded
            if time.monotonic() > deadline or sender.poll() is not None:
                sender.kill()
                sink.kill()
                raise ConfigError(f"the background flow did not connect within {CONNECT_TIMEOUT_S:g} s: "
                                  f"{sender.communicate()[1].strip()[-300:]}")
            time.sleep(0.1)
        return sink, sender, time.monotonic()

    def _background_connected(self) -> bool:
        listed = self.cluster.run("h1", ["ss", "-Htn", "state", "established", f"( sport = :{SINK_PORT} )"],
                                  timeout=30, capture_output=True, text=True)
        return bool(listed.stdout.strip())

    def _background_stop(self, background) -> float:
        """The background flow's goodput (bits/s) from its connection to now, as the sink counted it."""
        sink, sender, connected = background
        elapsed = time.monotonic() - connected
        sender.kill()
        sender.communicate()
        sink.send_signal(signal.SIGTERM)
        out, _ = sink.communicate(timeout=30)
        counts = json.loads(out.strip().splitlines()[-1])
        return 8 * counts["bytes_total"] / elapsed

    def run(self) -> dict:
        s = self.s
        load_before = load_average()
        self.start()
        try:
            rows = []
            for rep in range(s.repetitions):
                order = list(s.policies[rep % len(s.policies):]) + list(s.policies[:rep % len(s.policies)])
                for policy in order:
                    row = self.segment(policy)
                    row["repetition"] = rep
                    rows.append(row)
                    self.progress(row_line(row))
        finally:
            self.stop()
        return {"settings": asdict(s), "jobs": self.names, "weights": self.weights,
                "compute_s": self.compute_s, "rows": rows, "summary": summarize(rows),
                "load_average": {"before": load_before, "after": load_average()}, "cpus": os.cpu_count()}


def _model_bytes(spec: JobSpec) -> float:
    """Bytes one worker pushes per iteration: the profiled model's parameters (float32) x size_scale."""
    from geryon.categorize.profiles import resolve_profile  # lazy: reads the packaged per-layer profiles

    return resolve_profile(spec.model, batch=spec.batch).param_bytes * spec.size_scale


def _run_all(jobs, iterations: int) -> list[list[list[dict]]]:
    """Every job's workers run `iterations` back to back, all jobs at once; steps per job, per worker."""
    for job in jobs:
        for worker in job.workers:
            worker.send("run", iterations=iterations)
    steps = []
    for job in jobs:
        steps.append([worker.receive(timeout=600)["steps"] for worker in job.workers])
        job.iterations += iterations
    return steps


def summarize(rows: list[dict]) -> dict:
    """Per policy: the median over repetitions of aggregate utilisation, each job's, background share."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        out[policy] = {
            "aggregate_utilisation": statistics.median(r["aggregate_utilisation"] for r in mine),
            "jobs": {j["job"]: {"median_iteration_s": statistics.median(
                         x["median_iteration_s"] for r in mine for x in r["jobs"] if x["job"] == j["job"]),
                         "utilisation": statistics.median(
                         x["utilisation"] for r in mine for x in r["jobs"] if x["job"] == j["job"])}
                     for j in mine[0]["jobs"]},
            "background_share": (None if mine[0]["background_share"] is None else
                                 statistics.median(r["background_share"] for r in mine)),
        }
    return out


def row_line(row: dict) -> str:
    jobs = "  ".join(f"{j['job']} {j['median_iteration_s'] * 1e3:.0f} ms util {j['utilisation']:.2f}"
                     for j in row["jobs"])
    share = "" if row["background_share"] is None else f"  background {row['background_share']:.1%}"
    return f"{row['policy']:<15} aggregate util {row['aggregate_utilisation']:.3f}  {jobs}{share}"


def run_tenants_bench(settings: TenantSettings, progress=None) -> dict:
    return TenantsBench(settings, progress).run()


def add_command(bench) -> None:
    parser = bench.add_parser("tenants", help="2-3 replayed PS and allreduce jobs and a background flow on one "
                                "emulated fabric")
    parser.add_argument("--models", default="vgg19,resnet50:allreduce",
                        help="one replayed job per entry, comma-separated: MODEL or MODEL:ps (a PS job), "
                             "MODEL:allreduce (a ring allreduce job) (default vgg19,resnet50:allreduce)")
    parser.add_argument("--workers", type=int, default=2, help="workers per job, each job as many servers")
    parser.add_argument("--rate", default="200mbit", help="every emulated link (default 200mbit)")
    parser.add_argument("--size-scale", type=float, default=0.01, help="tensor sizes x this (default 0.01)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="replayed compute x this (default 1)")
    parser.add_argument("--iterations", type=int, default=10, help="measured iterations per segment")
    parser.add_argument("--warmup", type=int, default=2, help="iterations before each segment's measure")
    parser.add_argument("--repetitions", type=int, default=1, help="passes over the policies, order rotated")
    parser.add_argument("--background-percent", type=int, default=BACKGROUND_PERCENT,
                        help=f"the background class's guaranteed share (default {BACKGROUND_PERCENT})")
    parser.add_argument("--no-background", action="store_true", help="no background flow")
    parser.add_argument("--offload", action="store_true",
                        help="keep GSO/TSO on the emulated links: 64 KB super-packets, which HTB's round robin "
                             "serves one per class per turn, so the bulk and background weights do not hold")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"subset of {', '.join(POLICIES)}")
    parser.add_argument("--json", action="store_true", help="print the whole record as JSON")
    parser.set_defaults(func=run_from_args)


def run_from_args(args) -> int:
    import sys

    from geryon.errors import PermissionNeeded

    if os.geteuid() != 0:
        raise PermissionNeeded("geryon bench tenants runs its jobs on an emulated cluster in network namespaces "
                               "and needs root; run it with sudo")
    settings = TenantSettings(models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
                              workers=args.workers, rate=args.rate, size_scale=args.size_scale,
                              time_scale=args.time_scale, iterations=args.iterations, warmup=args.warmup,
                              repetitions=args.repetitions, background_percent=args.background_percent,
                              background=not args.no_background, offload=args.offload,
                              policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()))
    record = run_tenants_bench(settings, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        for policy, row in record["summary"].items():
            share = row["background_share"]
            print(f"{policy:<15} aggregate utilisation {row['aggregate_utilisation']:.3f}"
                  + "".join(f"  {job} {v['median_iteration_s'] * 1e3:.0f} ms ({v['utilisation']:.2f})"
                            for job, v in row["jobs"].items())
                  + ("" if share is None else f"  background {share:.1%}"))
        print(f"load average before/after: {record['load_average']['before']}/{record['load_average']['after']}"
              f" on {record['cpus']} cores")
    return 0
