"""`geryon bench paper`: the paper's scaling table, measured on replayed models over the real transport.

    rows = run_paper_bench(PaperSettings(models=("vgg19",)), progress=print)

Per model: an emulated cluster (`paper_job.PaperJob`: 8 hosts, each a worker and a server in the
colocated layout, strict-priority queues for DSCP 46/0 on every port), then per TCP congestion
control and per link (10GbE, 40GbE equivalents): R repetitions of every policy, the order rotated
per repetition (so drift on the shared machine hits all alike), each a segment of `warmup` +
`iterations` back-to-back iterations after a fresh connection; then the `control-nolimit` row
(the same job, ports unshaped in effect) and, for VGG-19 (or the first model of a run without it),
the paper's slicing-size table (geryon vs endhost at 1024K / 512K / 256K parameters per slice, 10GbE).

Calibration (once, `paper_math.calibration_step`): on VGG-19 vanilla at 10GbE the compute scale is
moved until the measured scaling efficiency is the paper's 26.9% (at most `calibration_probes`
probes, stopping within `calibration_tolerance`); every other cell is a prediction with that one
number. Without VGG-19 in the run, `--compute-scale` (default: the value calibrated in
docs/paper-table.md) is used as given.

Policies (transport settings per segment; `--priority`, `--placement` and `--slice` apply to all
the sliced ones):
    vanilla   whole tensors, round-robin over servers, one FIFO flow per peer
    slicing   slices spread over servers, FIFO (the paper's Partition + Slicing)
    endhost   slices, sender-side priority queue by class (CONV before FC), then arrival
    geryon    slices, one flow per class marked DSCP 46/0, arrival order within a class
With `mode="allreduce"` the same models, links, workers and compute scale run as a ring of the
workers (geryon.bench.replay_ddp: DDP-sized buckets in backward order, each averaged by the ring
allreduce as soon as backward fills it; no servers, no control row, no slicing table). `vanilla` and
`slicing` there have no classes (DDP's own order); `+overlap` lets the next forward wait per layer for
its own parameters (--overlap next-forward) instead of for every bucket (DDP's barrier). The compute
scale is PS mode's calibrated one (`--compute-scale`, default DEFAULT_COMPUTE_SCALE): the paper
gives no allreduce figure to calibrate on.
Inside a class the replayed roles send in arrival order (replay_roles' `--within-class fifo`, the
paper's Geryon); `+urgency` orders by forward position inside a class too (TicTac/P3-like end-host
scheduling). Variants for the design investigation are named policy+option (see VARIANTS).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from geryon.bench.paper_job import JobSpec, PaperJob, role_cpu_seconds
from geryon.bench.paper_math import (CLASS_THREAD_NICE, COMPUTE_RT_PRIORITY, CONTROL, THREAD_RT_PRIORITY,
                                     PaperScale, calibration_step, cpu_share, make_row, read_proc_stat,
                                     rotated, summarize)
from geryon.categorize.replay import BENCH_SPIN_MARGIN_S
from geryon.emulate.cluster import DEFAULT_ACK_PRIORITY
from geryon.errors import ConfigError
from geryon.netconf.plan import parse_ack_priority
from geryon.signals import sigterm_as_interrupt
from geryon.sim.paper import CALIBRATION_CELL, LINKS, PAPER_SLICING, PAPER_WORKERS, paper_efficiency
from geryon.transport.policy import POLICIES

# compute scale calibrated on VGG-19 vanilla 10GbE (docs/paper-table.md); used when a run has no VGG-19
DEFAULT_COMPUTE_SCALE = 11.0
NOLIMIT_RATE = 10_000_000_000          # "no limit": HTB at 10 Gbit/s never binds here (CPU does first)
DEFAULT_SLICE_PARAMS = 1024 * 1024     # the paper's best slice size (Table IV)
SLICE_TABLE = (1024 * 1024, 512 * 1024, 256 * 1024)
SLICE_TABLE_POLICIES = ("geryon", "endhost")

# policy name -> transport settings; "a+b" variants add options on top of the base policy
BASE_POLICIES = {
    "vanilla": {"policy": "vanilla"},
    "slicing": {"policy": "slicing"},
    "endhost": {"policy": "endhost"},
    "geryon": {"policy": "geryon"},
}
VARIANTS = {
    "bytes": {"placement": "bytes"},           # byte-balanced slice placement over servers
    "fifo": {"within_class": "fifo"},          # arrival order inside a class (the default already)
    "urgency": {"within_class": "urgency"},    # forward-position order inside a class (TicTac/P3)
    "threshold": {"priority": "threshold"},    # threshold split at --threshold instead of CONV/FC
    "overlap": {"overlap": "next-forward"},    # allreduce: the next forward waits per layer, not for all
}
MODES = ("ps", "allreduce")


def policy_transport(name: str, defaults: dict) -> dict:
    """Transport settings of a policy name like "geryon" or "geryon+bytes"."""
    base, *options = name.split("+")
    if base not in BASE_POLICIES:
        raise ConfigError(f"unknown policy {base!r}: choose from {', '.join(BASE_POLICIES)} "
                          f"(variants: +{', +'.join(VARIANTS)}) or {CONTROL}")
    settings = dict(defaults)
    settings.update(BASE_POLICIES[base])
    for option in options:
        if option not in VARIANTS:
            raise ConfigError(f"unknown policy option +{option}: choose from +{', +'.join(VARIANTS)}")
        settings.update(VARIANTS[option])
    return settings


def parse_params(text: str) -> int:
    """'1024K' -> 1048576 parameters, '1M' -> 1048576, '40000' -> 40000."""
    text = text.strip().upper()
    factor = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    try:
        value = int(float(text[:-1] if factor > 1 else text) * factor)
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a parameter count (e.g. 1024K, 1M, 40000)") from None
    if value < 256:
        raise ConfigError(f"slices of {value} parameters are too small")
    return value


PULL_MODES = ("ahead", "end")


@dataclass(frozen=True)
class PaperSettings:
    models: tuple[str, ...] = ("vgg19",)
    links: tuple[str, ...] = ("10gbe", "40gbe")
    workers: int = PAPER_WORKERS
    layout: str = "colocated"
    policies: tuple[str, ...] = tuple(POLICIES)
    congestions: tuple[str, ...] = ("bbr",)
    repetitions: int = 3
    warmup: int = 2
    iterations: int = 3
    size_scale: float = 0.01
    wall_scale: float = 1.0
    compute_scale: float | None = None      # None: calibrate on VGG-19 (else DEFAULT_COMPUTE_SCALE)
    calibration_start: float = DEFAULT_COMPUTE_SCALE
    calibration_probes: int = 3
    calibration_tolerance: float = 0.01
    slice_params: int = DEFAULT_SLICE_PARAMS
    slice_table: tuple[int, ...] = SLICE_TABLE
    slice_table_repetitions: int = 2
    control: bool = True
    priority: str = "coarse"                # "coarse" (CONV/FC) or "threshold" (at `threshold`)
    threshold: float = 0.5
    placement: str = "count"
    notsent_lowat: int = 16 * 1024
    batch: int = 32
    spin_margin: float = BENCH_SPIN_MARGIN_S
    timeline: str | None = None
    compute_iterations: int = 3
    control_rate: int = NOLIMIT_RATE
    nice: int = 0
    pull: str = "end"                       # "end": pull asked after the last push; "ahead": with the first
    class_thread_nice: int = CLASS_THREAD_NICE   # TransportConfig.class_thread_nice of the roles
    thread_rt: int = THREAD_RT_PRIORITY     # TransportConfig.thread_rt_priority of the roles
    compute_rt: int = COMPUTE_RT_PRIORITY   # SCHED_RR priority of the workers' replayed compute
    ack_priority: str = DEFAULT_ACK_PRIORITY  # pure ACKs on every emulated egress (EmulatedCluster)
    mode: str = "ps"                        # "ps" or "allreduce" (ring, policies with and without +overlap)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r}: choose {' or '.join(MODES)}")
        overlapped = [name for name in self.policies if "overlap" in name.split("+")[1:]]
        if self.mode == "ps" and overlapped:
            raise ConfigError(f"policy {overlapped[0]} is for --mode allreduce; PS mode's counterpart is "
                              "--pull ahead (each layer's parameters pulled as soon as they are updated)")
        for link in self.links:
            if link not in LINKS:
                raise ConfigError(f"link {link!r}: choose from {', '.join(LINKS)}")
        if self.repetitions < 1 or self.iterations < 1 or self.warmup < 0:
            raise ConfigError("need repetitions >= 1, iterations >= 1 and warmup >= 0")
        for name in self.policies:
            policy_transport(name, {})
        parse_ack_priority(self.ack_priority)
        if not 0 <= self.compute_rt <= 99:
            raise ConfigError(f"compute_rt {self.compute_rt}: 0 (off) or a SCHED_RR priority 1..99")
        if self.pull not in PULL_MODES:
            raise ConfigError(f"pull {self.pull!r}: choose {' or '.join(PULL_MODES)}")
        for congestion in self.congestions:
            if congestion not in ("bbr", "cubic", "reno", "system"):
                raise ConfigError(f"congestion {congestion!r}: choose bbr, cubic, reno or system")

    def transport_defaults(self, scale: PaperScale, slice_params: int | None = None) -> dict:
        return {"slice_bytes": scale.slice_bytes(slice_params or self.slice_params),
                "priority": self.priority, "placement": self.placement,
                "notsent_lowat": self.notsent_lowat}


class PaperBench:
    """One run: clusters, jobs, segments; rows collected as they are measured."""

    def __init__(self, settings: PaperSettings, progress=None, on_model_done=None):
        self.settings = settings
        self.on_model_done = on_model_done
        self.progress = progress or (lambda line: None)
        self.rows: list[dict] = []
        self.slicing_rows: list[dict] = []
        self.calibration: dict | None = None
        self.cpu: dict = {}
        self.traces: list[str] = []
        self.waits: dict[str, dict] = {}     # trace path -> forward waits (paper_trace.forward_waits)
        self.blocked: list[float] = []       # blocked-on-pull seconds of the slowest worker, per iteration
        self.compute_scale = settings.compute_scale
        self.started = time.perf_counter()

    def say(self, line: str) -> None:
        self.progress(f"[{time.perf_counter() - self.started:6.0f} s] {line}")

    def scale(self) -> PaperScale:
        return PaperScale(self.compute_scale or DEFAULT_COMPUTE_SCALE, self.settings.size_scale,
                          self.settings.wall_scale)

    # -- the whole run ------------------------------------------------------------------------
    def run(self) -> dict:
        s = self.settings
        if self.compute_scale is None and ("vgg19" not in s.models or s.mode == "allreduce"):
            # the compute scale is calibrated on the paper's PS cell; allreduce mode reuses that one number
            self.compute_scale = DEFAULT_COMPUTE_SCALE
        models = sorted(s.models, key=lambda m: m != "vgg19")   # VGG-19 first: it calibrates
        self.slice_table_model = models[0]      # the paper's Table IV is VGG-19's; else the first model
        machine_before = read_proc_stat()
        for model in models:
            self.run_model(model)
            if self.on_model_done is not None:     # e.g. write the outputs so far
                self.on_model_done(self.record())
        machine_after = read_proc_stat()
        self.cpu["machine_share_run"] = cpu_share(machine_before, machine_after)
        self.cpu["steal_share_run"] = cpu_share(machine_before, machine_after, "steal")   # another guest's
        return self.record()

    def run_model(self, model: str) -> None:
        from geryon.emulate import EmulatedCluster

        s = self.settings
        calibrate = self.compute_scale is None and model == "vgg19"
        scale = PaperScale(self.compute_scale or s.calibration_start, s.size_scale, s.wall_scale)
        spec = JobSpec(model=model, workers=s.workers, layout=s.layout, batch=s.batch,
                       time_scale=scale.replay_time_scale, size_scale=s.size_scale,
                       spin_margin=s.spin_margin, threshold=s.threshold, nice=s.nice,
                       pull_ahead=s.pull == "ahead", class_thread_nice=s.class_thread_nice,
                       thread_rt=s.thread_rt, compute_rt=s.compute_rt, collective=s.mode)
        name = "p" + uuid.uuid4().hex[:5]
        roles = s.workers if s.mode == "allreduce" else 2 * s.workers
        self.say(f"{model}: cluster {name}, {spec.hosts} hosts ({s.layout}), starting "
                 f"{roles} role processes ({s.mode})")
        with sigterm_as_interrupt(), EmulatedCluster(name, hosts=spec.hosts,
                                                     bw=scale.link_rate(LINKS[s.links[0]]),
                                                     priority=True, ack_priority=s.ack_priority) as cluster:
            job = PaperJob(cluster, spec)
            try:
                job.start()
                if calibrate:
                    self.calibrate(job, s.congestions[0])
                    scale = self.scale()
                compute = self.measure_compute(job)
                self.say(f"{model}: one worker compute-only {compute:.3f} s per iteration "
                         f"(batch {s.batch}, compute scale {scale.compute_scale:.3g})")
                for congestion in s.congestions:
                    for link in s.links:
                        self.run_link(job, model, link, congestion, scale, compute)
                    if s.control and s.mode == "ps":
                        self.run_control(job, model, congestion, scale, compute)
                    if model == self.slice_table_model and s.slice_table and "10gbe" in s.links \
                            and s.mode == "ps":
                        self.run_slice_table(job, model, congestion, scale, compute)
            finally:
                job.stop()
            self.cpu.setdefault("verification", {})[model] = job.verification()

    def measure_compute(self, job: PaperJob) -> float:
        reply = job.compute_only(self.settings.compute_iterations)
        return summarize(reply["seconds"])["median"]

    # -- calibration --------------------------------------------------------------------------
    def calibrate(self, job: PaperJob, congestion: str) -> None:
        s = self.settings
        model, link, policy = CALIBRATION_CELL
        target = paper_efficiency(model, link, policy)
        k = s.calibration_start
        job.set_rate(PaperScale(k, s.size_scale, s.wall_scale).link_rate(LINKS[link]))
        probes = []
        for probe in range(s.calibration_probes):
            scale = PaperScale(k, s.size_scale, s.wall_scale)
            job.set_time_scale(scale.replay_time_scale)
            compute = self.measure_compute(job)
            times = self.segment(job, policy, scale, congestion)
            iteration = summarize(times)["median"]
            efficiency = compute / iteration
            probes.append({"compute_scale": k, "compute_s": compute, "iteration_s": iteration,
                           "scaling_efficiency": efficiency, "times": times})
            self.say(f"calibration probe {probe + 1}: compute scale {k:.3f} -> {model} {policy} {link} "
                     f"efficiency {100 * efficiency:.1f}% (paper {100 * target:.1f}%)")
            if abs(efficiency - target) <= s.calibration_tolerance:
                break
            k = calibration_step(k, compute, iteration, target)
        else:
            # the last step's k was never measured; keep the probe closest to the target
            best = min(probes, key=lambda p: abs(p["scaling_efficiency"] - target))
            k = best["compute_scale"]
        self.compute_scale = k
        job.set_time_scale(PaperScale(k, s.size_scale, s.wall_scale).replay_time_scale)
        self.calibration = {"cell": list(CALIBRATION_CELL), "target": target, "compute_scale": k,
                            "probes": probes, "congestion": congestion}
        self.say(f"calibrated compute scale: {k:.3f} x the profiled GPU times "
                 f"(paper compute per VGG-19 iteration {k * job_profile_compute(job):.3f} s)")

    # -- segments -----------------------------------------------------------------------------
    def segment(self, job: PaperJob, policy: str, scale: PaperScale, congestion: str,
                slice_params: int | None = None, trace: str | None = None) -> list[float]:
        """Connect with `policy`, run warm-up + measured iterations, drain; the measured seconds."""
        s = self.settings
        transport = policy_transport(policy, s.transport_defaults(scale, slice_params))
        transport["congestion"] = "" if congestion == "system" else congestion
        job.connect(transport, trace_prefix=trace)
        times, steps = job.run(s.warmup + s.iterations)
        parts = job.drain()
        # per measured iteration: the slowest worker's time blocked on pulls, and its time beyond
        # compute + blocked (replay overrun: CPU contention delaying the sleeping replay)
        for index in range(s.warmup, s.warmup + s.iterations):
            slowest = max((worker[index] for worker in steps), key=lambda step: step["seconds"])
            self.blocked.append(slowest["blocked_s"])
        if trace and parts:
            from geryon.timeline import merge_parts

            from geryon.bench.paper_trace import forward_waits

            merge_parts(trace)
            self.traces.append(trace)
            self.waits[trace] = forward_waits(trace)
        return times[s.warmup:]

    def trace_path(self, *labels) -> str | None:
        if not self.settings.timeline:
            return None
        Path(self.settings.timeline).mkdir(parents=True, exist_ok=True)
        name = "-".join(str(label).replace("+", "_") for label in labels)
        return str(Path(self.settings.timeline) / f"{name}.json")

    def run_link(self, job, model, link, congestion, scale, compute) -> None:
        s = self.settings
        job.set_rate(scale.link_rate(LINKS[link]))
        self.say(f"{model} {link} {congestion}: {scale.describe(LINKS[link])}")
        times = {policy: [] for policy in s.policies}
        cpu = {policy: 0.0 for policy in s.policies}
        blocked = {policy: [] for policy in s.policies}
        for rep in range(s.repetitions):
            for policy in rotated(s.policies, rep):
                trace = None
                before = role_cpu_seconds(job.pids)
                started = time.perf_counter()
                mark = len(self.blocked)
                measured = self.segment(job, policy, scale, congestion, trace=trace)
                blocked[policy].extend(self.blocked[mark:])
                cpu[policy] += role_cpu_seconds(job.pids) - before
                times[policy].extend(measured)
                self.say(f"{model} {link} {congestion} rep {rep + 1}/{s.repetitions} {policy:<14} "
                         f"median {summarize(measured)['median']:.3f} s "
                         f"({time.perf_counter() - started:.0f} s)")
        if s.timeline:
            # traced segments run apart and are not measured: the tracer's CPU cost slows an
            # iteration by several percent on 2 shared cores
            for policy in s.policies:
                self.segment(job, policy, scale, congestion, trace=self.trace_path(model, link, congestion, policy))
                self.say(f"{model} {link} {congestion} {policy}: traced segment written (not measured)")
        vanilla = summarize(times["vanilla"])["median"] if times.get("vanilla") else None
        for policy in s.policies:
            trace = self.trace_path(model, link, congestion, policy)
            waits = self.waits.get(trace) if trace else None
            mode = {"mode": s.mode}
            if s.mode == "allreduce":   # the paper measured PS only: no paper figure for these cells
                mode.update(overlap=policy_transport(policy, {}).get("overlap", "barrier"),
                            paper_scaling_efficiency=None, error_points=None)
            row = make_row(model=model, link=link, policy=policy, workers=s.workers, layout=s.layout,
                           congestion=congestion, times=times[policy], compute_s=compute, batch=s.batch,
                           scale=scale, vanilla_s=vanilla,
                           extra={"table": "scaling", "blocked_s": summarize(blocked[policy])["median"],
                                  "cpu_roles_s_per_iteration": cpu[policy] / (s.repetitions * (
                                      s.warmup + s.iterations)),
                                  "trace": trace if waits else None,
                                  "first_layer_wait_s": waits["first_layer_wait_s"] if waits else None,
                                  "wait_s_per_iteration": waits["wait_s_per_iteration"] if waits else None,
                                  **mode})
            self.rows.append(row)
            self.say(_row_line(row))

    def run_control(self, job, model, congestion, scale, compute) -> None:
        s = self.settings
        job.set_rate(s.control_rate)
        policy = "geryon" if "geryon" in s.policies else s.policies[-1]
        times = []
        before_cpu, before_machine = role_cpu_seconds(job.pids), read_proc_stat()
        started = time.perf_counter()
        mark = len(self.blocked)
        for rep in range(s.repetitions):
            times.extend(self.segment(job, policy, scale, congestion))
        wall = time.perf_counter() - started
        if s.timeline:
            self.segment(job, policy, scale, congestion, trace=self.trace_path(model, "nolimit", congestion, policy))
        roles = (role_cpu_seconds(job.pids) - before_cpu) / wall
        after_machine = read_proc_stat()
        machine, steal = cpu_share(before_machine, after_machine), cpu_share(before_machine, after_machine, "steal")
        row = make_row(model=model, link="none", policy=CONTROL, workers=s.workers, layout=s.layout,
                       congestion=congestion, times=times, compute_s=compute, batch=s.batch, scale=scale,
                       vanilla_s=None, extra={"table": "scaling", "control_of": policy,
                                              "cpu_roles_cores": roles, "cpu_machine_cores": os.cpu_count(),
                                              "cpu_machine_share": machine,
                                              "cpu_steal_share": steal,
                                              "blocked_s": summarize(self.blocked[mark:])["median"],
                                              "link_rate_bits": s.control_rate})
        self.rows.append(row)
        self.cpu.setdefault("control", []).append({"model": model, "congestion": congestion,
                                                   "roles_cores": roles, "machine_share": machine,
                                                   "steal_share": steal})
        self.say(_row_line(row) + f"  CPU: role processes {roles:.2f} of {os.cpu_count()} cores, machine "
                 f"{100 * (machine or 0):.0f}% busy")

    def run_slice_table(self, job, model, congestion, scale, compute) -> None:
        s = self.settings
        link = "10gbe"
        job.set_rate(scale.link_rate(LINKS[link]))
        cells = [(params, policy) for params in s.slice_table for policy in SLICE_TABLE_POLICIES]
        times = {cell: [] for cell in cells}
        for rep in range(s.slice_table_repetitions):
            for params, policy in rotated(cells, rep):
                measured = self.segment(job, policy, scale, congestion, slice_params=params)
                times[(params, policy)].extend(measured)
                self.say(f"slice table {params // 1024}K {policy:<8} rep {rep + 1} "
                         f"median {summarize(measured)['median']:.3f} s")
        for params in s.slice_table:
            for policy in SLICE_TABLE_POLICIES:
                paper = PAPER_SLICING.get(params, {})
                row = make_row(model=model, link=link, policy=policy, workers=s.workers, layout=s.layout,
                               congestion=congestion, times=times[(params, policy)], compute_s=compute,
                               batch=s.batch, scale=scale, vanilla_s=None,
                               extra={"table": "slicing", "slice_params": params,
                                      "slice_bytes": scale.slice_bytes(params),
                                      "paper_images_per_s": paper.get(policy),
                                      "paper_geryon_over_endhost": (paper["geryon"] / paper["endhost"])
                                      if paper else None})
                self.slicing_rows.append(row)
        for params in s.slice_table:
            g, e = (next(r for r in self.slicing_rows if r["slice_params"] == params and r["policy"] == p
                         and r["congestion"] == congestion) for p in SLICE_TABLE_POLICIES)
            ratio = e["iteration_s"] / g["iteration_s"]
            for row in (g, e):
                row["geryon_over_endhost"] = ratio
            self.say(f"slice table {params // 1024}K: geryon {g['images_per_s']:.1f} vs endhost "
                     f"{e['images_per_s']:.1f} images/s (x{ratio:.3f}; paper x{g['paper_geryon_over_endhost']:.3f})")

    def record(self) -> dict:
        return {"settings": asdict(self.settings), "compute_scale": self.compute_scale,
                "calibration": self.calibration, "rows": self.rows, "slicing_rows": self.slicing_rows,
                "cpu": self.cpu, "traces": self.traces, "waits": self.waits,
                "wall_s": time.perf_counter() - self.started,
                "scaling_note": self.scale().describe(LINKS["10gbe"])}


def job_profile_compute(job: PaperJob) -> float:
    """Profiled (unscaled) forward + backward seconds of the job's model."""
    from geryon.categorize.profiles import resolve_profile

    profile = resolve_profile(job.spec.model, batch=job.spec.batch)
    return (profile.forward_ns + profile.backward_ns) * 1e-9


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _row_line(row: dict) -> str:
    error = "" if row["error_points"] is None else f" ({row['error_points']:+.1f} pts)"
    speed = "" if row["speedup_vs_vanilla"] is None else f" x{row['speedup_vs_vanilla']:.2f} vs vanilla"
    return (f"{row['model']} {row['link']} {row['congestion']} {row['policy']:<15} "
            f"{row['iteration_s']:.3f} s (IQR {row['iteration_spread']:.3f}) "
            f"{row['images_per_s']:.1f} img/s{speed}, efficiency {_pct(row['scaling_efficiency'])} "
            f"paper {_pct(row['paper_scaling_efficiency'])}{error}")


def run_paper_bench(settings: PaperSettings, progress=None, on_model_done=None) -> dict:
    """Measure everything `settings` asks for on fresh emulated clusters; the full record.

    `on_model_done(record)` is called after each model with the record so far (a later model's
    failure then loses only that model)."""
    return PaperBench(settings, progress, on_model_done).run()


def write_outputs(record: dict, out_dir: str) -> dict:
    """paper.json, paper.md and paper.png in `out_dir`; their paths."""
    from geryon.bench.paper_report import markdown_report, plot_paper

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "paper.json", "markdown": out / "paper.md", "png": out / "paper.png"}
    paths["json"].write_text(json.dumps(record, indent=1))
    paths["markdown"].write_text(markdown_report(record))
    plot_paper(record, paths["png"])
    return {k: str(v) for k, v in paths.items()}


__all__ = ["PaperBench", "PaperSettings", "policy_transport", "parse_params", "run_paper_bench",
           "write_outputs"]
