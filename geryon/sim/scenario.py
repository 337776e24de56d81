"""One simulated setting as data (`SimSetting`), and the three things done with it.

- `simulate(setting, policy)`: the fluid simulation (job.py) -> a result row;
- `analytic_s(setting, policy)`: the slides' recurrence (categorize/model.py) with the per-worker
  bandwidth a PS worker really has: in the colocated layout every host link carries the worker's
  pushes AND its server's pulls, 2(N-1)/N of the model per direction, so B_eff = B N / (2(N-1));
  separate servers leave B (with as many servers as workers, and enough of them);
- `calibrate(...)`: the ONE compute-time scale that makes the calibration cell (VGG-19, vanilla,
  10GbE, 8 colocated workers) reach the paper's 26.9% scaling efficiency.
Compute times are the profile's (batch 32 on the profiling GPU) times `compute_scale`.

A link's rate counts whole frames, so parameters move at its payload rate (`SimSetting.payload_bps`):
with a 1500-byte MTU a TCP segment carries 1448 bytes (IPv4 20, TCP 20, timestamps 12) in a frame of
1538 bytes on a real Ethernet wire (header 14, FCS 4, preamble 8, gap 12): 94.1% of 10 Gbit/s. An
emulated port (HTB on a veth) counts the 14-byte header only: 1448 / 1514 = 95.6%
(`EMULATED_FRAME_BYTES`; `--compare` uses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from geryon.categorize.model import IterationModel, Tensor
from geryon.categorize.profiles import LayerProfile, resolve_profile
from geryon.errors import ConfigError
from geryon.sim.fabric import build_fabric
from geryon.sim.job import EXACT_LIMIT, PSJob
from geryon.sim.queues import QueueTable
from geryon.sim.paper import CALIBRATION_CELL, LINKS, paper_efficiency
from geryon.sim.workload import build_workload

MODELS = ("vgg19", "resnet50", "alexnet", "inceptionv3")
MAX_WORKERS = 1024
DEFAULT_SLICE_PARAMS = 1024 * 1024   # the paper's 1024K parameters per slice (4 MiB of float32)
PACKET_HEADER_BYTES = 52     # IPv4 20 + TCP 20 + TCP timestamps 12, inside the MTU
ETHERNET_FRAME_BYTES = 38    # beyond the IP packet on a real wire: header 14, FCS 4, preamble 8, gap 12
EMULATED_FRAME_BYTES = 14    # beyond the IP packet as HTB counts it on a veth: the Ethernet header
MTU_RANGE = (576, 9216)


def payload_rate(line_bps: float, mtu: int = 1500, frame_bytes: int = ETHERNET_FRAME_BYTES) -> float:
    """TCP payload bits per second on a link of `line_bps` that counts `frame_bytes` beyond each IP packet."""
    return line_bps * (mtu - PACKET_HEADER_BYTES) / (mtu + frame_bytes)


@dataclass(frozen=True)
class SimSetting:
    """Everything one simulated cell depends on (all rates in bit/s, times in seconds)."""

    model: str = "vgg19"
    link: str | None = "10gbe"     # label; None when --bw set a rate of its own
    bw_bps: float = 10e9
    workers: int = 8
    servers: int | None = None     # default: one per worker
    layout: str = "colocated"
    topology: str = "star"
    oversubscription: float = 1.0
    hosts_per_leaf: int | None = None
    classes: int = 2
    thresholds: tuple[float, ...] = ()
    slice_params: int = DEFAULT_SLICE_PARAMS
    placement: str = "count"
    compute_scale: float = 1.0
    iterations: int = 10
    aggregation_s: float = 0.0
    exact: bool = False
    floor: float = 0.0             # what-if: share of every port guaranteed to each class
    push_class: str = "class"      # what-if: "high" sends every push in the top class
    backlog_bytes: float = 0.0     # TCP: bytes a connection's socket holds ahead of a new frame (job.py)
    latency_s: float = 0.0         # per-frame delivery latency (processing at both ends)
    within_class: str = "urgency"  # endhost/geryon send order inside a class: urgency or fifo
    queues: QueueTable | None = None   # TCP's standing queues at the ports (queues.py), paper bytes
    pull_ahead: bool = False       # the next pull asked with the first push (bench paper --pull ahead)
    mtu: int = 1500                # IP packet size on the links (9000: jumbo frames)
    frame_bytes: int = ETHERNET_FRAME_BYTES   # what the link rate counts per packet beyond the IP packet

    def __post_init__(self):
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers must be 1..{MAX_WORKERS}, got {self.workers}")
        if not self.bw_bps > 0:
            raise ConfigError(f"the link rate must be positive, got {self.bw_bps}")
        if self.exact and self.workers > EXACT_LIMIT:
            raise ConfigError(f"--exact is for at most {EXACT_LIMIT} workers; use the aggregate "
                              "model (the default) beyond")
        if self.iterations < 1 or self.compute_scale <= 0 or self.slice_params < 1:
            raise ConfigError("need --iterations >= 1, --compute-scale > 0 and --slice-params >= 1")
        if not MTU_RANGE[0] <= self.mtu <= MTU_RANGE[1]:
            raise ConfigError(f"--mtu must be {MTU_RANGE[0]}-{MTU_RANGE[1]} bytes, got {self.mtu}")
        if self.frame_bytes < 0:
            raise ConfigError(f"frame_bytes must be >= 0, got {self.frame_bytes}")

    @property
    def payload_bps(self) -> float:
        """The rate at which parameter bytes cross a link: the line rate less every packet's headers."""
        return payload_rate(self.bw_bps, self.mtu, self.frame_bytes)

    @property
    def server_count(self) -> int:
        return self.servers or self.workers

    def profile(self) -> LayerProfile:
        return resolve_profile(self.model)

    def describe(self) -> str:
        text = (f"{self.model}, {self.workers} workers, {self.server_count} servers {self.layout}, "
                f"{self.bw_bps / 1e9:g} Gbit/s {self.topology}")
        if self.topology == "leafspine":
            text += f" (oversubscription {self.oversubscription:g}:1)"
        return text


def _compute(profile: LayerProfile, scale: float):
    return ([layer.forward_ns * 1e-9 * scale for layer in profile.layers],
            [layer.backward_ns * 1e-9 * scale for layer in profile.layers])


def simulate(setting: SimSetting, policy: str, profile: LayerProfile | None = None) -> dict:
    """Simulate one policy in one setting; the row's fields are those of `bench paper`."""
    profile = profile or setting.profile()
    fabric = build_fabric(setting.workers, setting.server_count, setting.layout, setting.payload_bps,
                          setting.topology, setting.oversubscription, setting.hosts_per_leaf)
    workload = build_workload(profile, policy, setting.server_count, setting.slice_params * 4,
                              classes=setting.classes, thresholds=setting.thresholds or None,
                              placement=setting.placement, push_class=setting.push_class,
                              within_class=setting.within_class)
    forward, backward = _compute(profile, setting.compute_scale)
    job = PSJob(workload, fabric, forward, backward, setting.aggregation_s, exact=setting.exact,
                floor=setting.floor, backlog_bytes=setting.backlog_bytes, latency_s=setting.latency_s,
                queues=setting.queues, pull_ahead=setting.pull_ahead)
    result = job.run(setting.iterations)
    iteration = result.iteration_s()
    batch = profile.batch or 32
    efficiency = result.compute_s / iteration
    return {"model": setting.model, "link": setting.link, "bw_gbit": setting.bw_bps / 1e9,
            "policy": policy, "workers": setting.workers, "servers": setting.server_count,
            "layout": setting.layout, "topology": setting.topology,
            "oversubscription": setting.oversubscription, "classes": setting.classes,
            "iteration_s": iteration, "images_per_s": batch * setting.workers / iteration,
            "scaling_efficiency": min(1.0, efficiency), "compute_s": result.compute_s,
            "analytic_iteration_s": analytic_s(setting, policy, profile),
            "paper_scaling_efficiency": paper_efficiency(setting.model, setting.link, policy)
            if setting.workers == 8 and setting.layout == "colocated" else None,
            "compute_scale": setting.compute_scale, "slice_params": setting.slice_params,
            "first_layer_wait_s": _mean(result.first_layer_wait[1:]),
            "events": result.events, "exact": setting.exact}


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


def effective_bandwidth(setting: SimSetting) -> float:
    """Per-worker payload bandwidth per direction the analytic model gets (see module doc)."""
    n = setting.workers
    if setting.layout == "colocated":
        return setting.payload_bps * (n / (2 * (n - 1)) if n > 1 else math.inf)
    return setting.payload_bps * min(1.0, setting.server_count / n)


def analytic_s(setting: SimSetting, policy: str, profile: LayerProfile | None = None) -> float:
    """The slides' iteration time for the policy (one link per direction, model.py)."""
    profile = profile or setting.profile()
    bandwidth = effective_bandwidth(setting)
    if not math.isfinite(bandwidth):
        return sum(_compute(profile, setting.compute_scale)[0]) + sum(_compute(profile, setting.compute_scale)[1])
    model = IterationModel.from_profile(profile, bandwidth, time_scale=setting.compute_scale,
                                        aggregation_s=setting.aggregation_s)
    if policy == "vanilla" or policy == "slicing":
        classes = [0] * len(model.tensors)
    elif policy == "endhost":
        classes = list(range(len(model.tensors)))   # full urgency order at the sender
    else:
        from geryon.sim.workload import tensor_classes
        classes = tensor_classes(profile, setting.classes, setting.thresholds or None)
    return model.priority_iteration_time(classes)


def potential_speedup(profile: LayerProfile, bandwidth_bps: float, compute_scale: float) -> float:
    """The slides' potential speedup: throughput with pulls in order 1..L over reverse order."""
    model = IterationModel.from_profile(profile, bandwidth_bps, time_scale=compute_scale)
    layers = list(range(model.layers))
    return model.slides_iteration_time(layers[::-1]) / model.slides_iteration_time(layers)


def calibrate(setting: SimSetting | None = None, target: float | None = None) -> float:
    """The compute scale at which the calibration cell reaches the paper's efficiency (bisection)."""
    model, link, policy = CALIBRATION_CELL
    target = paper_efficiency(*CALIBRATION_CELL) if target is None else target
    base = replace(setting or SimSetting(), model=model, link=link, bw_bps=LINKS[link], workers=8,
                   servers=None, layout="colocated", topology="star", iterations=4, exact=False)
    profile = base.profile()
    low, high = math.log(0.01), math.log(1000.0)
    for _ in range(40):
        middle = (low + high) / 2
        row = simulate(replace(base, compute_scale=math.exp(middle)), policy, profile)
        if row["compute_s"] / row["iteration_s"] < target:
            low = middle
        else:
            high = middle
        if high - low < 1e-4:
            break
    return math.exp((low + high) / 2)


__all__ = ["EMULATED_FRAME_BYTES", "ETHERNET_FRAME_BYTES", "MODELS", "SimSetting", "analytic_s", "calibrate",
           "effective_bandwidth", "payload_rate", "potential_speedup", "simulate", "Tensor"]
