"""`geryon sim --jobs`: several training jobs and a background flow on one fabric, under the tenants
bench's four policies, by a fluid event simulation of one representative worker host.

    result = simulate_jobs(JobsSetting(jobs=(JobMix("vgg19", "ps"), JobMix("resnet50", "allreduce")),
                                       workers=512, rate_bps=100e9, oversubscription=4), "fabric")

The model. Every job has `workers` workers, all jobs' workers on the same hosts (as `geryon bench
tenants` places them), PS servers on hosts of their own; workers are symmetric, so one worker host
stands for all: its port out (`up`) and in (`down`), and, when a flow crosses the spine of a
leaf-spine fabric, that host's share of its leaf's uplink (`spine_up`, `spine_down`: rate /
oversubscription each, the leaf's hosts sharing the uplink evenly). Per job and iteration, from the
model's per-layer profile (compute times x compute_scale, parameter bytes x size_scale):

    forward  layer l waits for its parameters (PS: the pulled version; allreduce: its averaged gradient)
    backward layer l's gradient leaves when its compute ends: a PS push (up), then, once pushed and
             once the backward pass ended (the pull is asked for then, as the replayed workers do), the
             pull of layer l (down); an allreduce sends and receives 2(W-1)/W x its bytes (up and down)
    background  one bulk flow into the host, never ending (a checkpoint reader), from beyond the leaf

Every job runs `warmup` then `iterations` iterations and keeps iterating until all jobs are done
(steady state), or, with `segments` (how `compare_record` runs a bench record), as the bench runs a
segment: warm-up, then, once the warm-up's transfers have landed (the bench starts the background
between the two runs), every job's iterations started together, a job that is done idling, the
background on from the measured start.

Each stream (job, direction, class, connection) sends its chunks one at a time in its sender's order:
FIFO for vanilla; the class first, then arrival, for endhost and the fabric policies (the replayed roles'
`--within-class fifo`). Tensors' classes are the replayed roles' (threshold_split at the job's
threshold, by position). A PS tensor moves as the job's transport policy (TRANSPORT_POLICY) deals it:
sliced over every server's connection at once (endhost, geryon), or whole on server tensor % servers
(vanilla, one stream per server). A ring collective, once its bytes have moved, holds its job for
2(W-1) steps of `ring_step_s` (each rank's threads receive, add and forward a slice per step; the
threads of a rank's process share its interpreter lock, so its collectives take turns whatever flow
they ride), so a job with one collective per layer pays collectives x steps of transport CPU per
iteration.

A port serves its flows as `geryon.netconf.render.linux` programs it: every present class gets its
guaranteed HTB rate (`class_rates`), the rest goes to the highest present priority level, weighted
levels split by weight; inside a class (one FIFO), flows share in proportion to the bytes each keeps in
flight: per TCP connection (a PS worker has one per server, a ring rank one to its neighbour per class),
the background's connection counting `background_window` times a job's (it never idles, so it keeps its
whole window, where a job's connection restarts from a small one after each compute phase). Under
vanilla and endhost everything is unmarked, so one class; under the fabric policies the classes of
`geryon.netconf.tenants.tenant_profile`, with job weights for fabric+weights (GPU intensity, as the
bench computes it). A flow on several ports moves at the least of its ports' shares.

`setting_from_record` simulates a bench record with the emulated port's measured constants
(EMULATED_BACKGROUND_WINDOW, EMULATED_RING_STEP_S); a what-if keeps per-connection sharing and no step
cost, the fabric's own behaviour without this machine's TCP and CPU.

A job computes as `ReplayedModel` replays it: each layer's deadline chains from the previous one's, a
blocked wait for a parameter pushes the chain back. With a bench record's CPU waits, every wake-up of
the replay thread waits what one of its wake-ups waited for a CPU there (`wake_wait_s`), and every ring
step two wake-ups of the rank's threads (`step_wait_s`; a record that did not count wake-ups gives only
the wait per iteration, `cpu_wait_s`, spread over the replay's modelled wake-ups); a late wake-up costs
the iteration only where the next layers' deadlines cannot absorb it.

What it leaves out: CPU contention beyond the measured waits (the emulation's 2 shared cores), TCP's own
dynamics beyond the background's window (slow start, queueing delay), latency, jitter (the bench's
iteration is the slowest worker's, the simulated one a representative worker's) and stragglers.
`compare_record` puts it beside a `geryon bench tenants` record, job by job.
"""

from __future__ import annotations

import heapq
import math
import statistics
import sys
from dataclasses import dataclass, field, replace

from geryon.categorize.classes import threshold_split
from geryon.categorize.profiles import LayerProfile, resolve_profile
from geryon.categorize.replay import BENCH_SPIN_MARGIN_S
from geryon.errors import ConfigError
from geryon.netconf.qos_profile import STRICT
from geryon.netconf.render.linux import class_rates
from geryon.netconf.tenants import BACKGROUND, BACKGROUND_PERCENT, BULK, Tenant, Tenants, tenant_profile
from geryon.sim.scenario import EMULATED_FRAME_BYTES, ETHERNET_FRAME_BYTES, MAX_WORKERS, payload_rate
from geryon.transport.policy import get_policy

POLICIES = ("vanilla", "endhost", "fabric", "fabric+weights")
# the transport policy (geryon.transport.policy) each job runs under each tenants policy
TRANSPORT_POLICY = {"vanilla": "vanilla", "endhost": "endhost", "fabric": "geryon", "fabric+weights": "geryon"}
# An emulated port's TCP and a replayed ring's CPU, measured (docs/results/simulator-tenants_x86-2core_2026-12-04.md).
# In one FIFO class, flows share a port in proportion to the bytes each keeps in flight. A job's connection
# idles between its bursts (compute) and restarts from a small window each time; the long-lived background
# keeps its whole window: `ss -tin` on the connections into the first worker's host while `bench tenants`
# ran (vanilla and endhost, two runs, 450 and 513 busy samples) gave it 2.7x the median bytes in flight of
# a job's connection (2.5-2.7x the mean).
EMULATED_BACKGROUND_WINDOW = 2.7
# CPU seconds a ring rank's transport threads spend per step of a collective (receive a slice, add it,
# forward it): a 40-byte collective of 2 ranks, 2 steps, takes 0.22 ms on loopback
# (`geryon bench allreduce --loopback --workers 2 --sizes 40 --repeat 200`); ResNet-50's 107 collectives
# queued back to back take 135-165 us each.
EMULATED_RING_STEP_S = 110e-6
RING_STEP_WAKEUPS = 2    # threads a ring step's slice wakes in turn: the receiving one, then the sending one
KINDS = ("ps", "allreduce")
THRESHOLD = 0.5          # the replayed jobs' default class split (JobSpec.threshold)
BATCH = 32
BACKGROUND_JOB = "background"
EPSILON_BITS = 1e-3
WARMUP = 5               # iterations before the measure: a job's first ones start with every parameter in place


@dataclass(frozen=True)
class JobMix:
    model: str
    kind: str = "ps"
    weight: float = 1.0      # fabric+weights: GPU time per byte delayed (set by `with_weights`)

    @staticmethod
    def parse(text: str) -> "JobMix":
        model, _, kind = text.strip().partition(":")
        kind = kind or "ps"
        if kind not in KINDS or not model:
            raise ConfigError(f"job {text!r}: give MODEL, MODEL:ps or MODEL:allreduce")
        return JobMix(model, kind)


@dataclass(frozen=True)
class JobsSetting:
    jobs: tuple[JobMix, ...]
    workers: int = 2                  # per job, on shared hosts
    rate_bps: float = 200e6           # every host link, line rate
    size_scale: float = 1.0
    compute_scale: float = 1.0
    oversubscription: float = 1.0
    hosts_per_leaf: int = 16
    background: bool = True
    background_percent: int = BACKGROUND_PERCENT
    iterations: int = 10
    warmup: int = WARMUP
    frame_bytes: int = ETHERNET_FRAME_BYTES   # EMULATED_FRAME_BYTES for an emulated (veth, HTB) port
    compute_s: tuple[float, ...] | None = None   # per job, measured compute per iteration (overrides profile)
    segments: bool = False   # as `bench tenants` runs them: warm-up, its transfers landed, then every job's
    #                          iterations started together, a job done idles, background on from the measured
    #                          start (else: steady state)
    cpu_wait_s: tuple[float, ...] | None = None  # per job, seconds per iteration its replay waited for a CPU
    wake_wait_s: tuple[float, ...] | None = None  # per job, seconds one wake-up of its replay thread waited
    step_wait_s: tuple[float, ...] | None = None  # per job, seconds one wake-up of any of its threads waited
    background_window: float = 1.0    # the background's bytes in flight over a job connection's, in one class
    #                                   (EMULATED_BACKGROUND_WINDOW for an emulated port; 1: per connection)
    ring_step_s: float = 0.0          # CPU per ring step and collective (EMULATED_RING_STEP_S when emulated)

    def __post_init__(self):
        if not self.jobs:
            raise ConfigError("give at least one job")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"workers per job must be 1-{MAX_WORKERS}, got {self.workers}")
        if self.hosts > MAX_WORKERS:
            raise ConfigError(f"{self.hosts} hosts: at most {MAX_WORKERS} (workers and PS servers); give fewer "
                              "--workers")
        if self.oversubscription < 1 or self.hosts_per_leaf < 1:
            raise ConfigError("oversubscription must be at least 1 and hosts per leaf at least 1")
        if any(j.kind == "allreduce" for j in self.jobs) and self.workers < 2:
            raise ConfigError("an allreduce job needs at least 2 workers")

    @property
    def hosts(self) -> int:
        """Worker hosts (shared by every job) and PS server hosts; the background comes from beyond them."""
        return (2 if any(j.kind == "ps" for j in self.jobs) else 1) * self.workers

    @property
    def payload_bps(self) -> float:
        return payload_rate(self.rate_bps, 1500, self.frame_bytes)


def job_profiles(setting: JobsSetting) -> list[LayerProfile]:
    return [resolve_profile(job.model, batch=BATCH) for job in setting.jobs]


def with_weights(setting: JobsSetting) -> JobsSetting:
    """Each job's weight = its GPU intensity (compute per iteration over bytes per iteration), as the
    tenants bench sets it."""
    profiles = job_profiles(setting)
    weights = []
    for index, profile in enumerate(profiles):
        compute = _job_compute_s(setting, index, profile)
        weights.append(compute / max(profile.param_bytes * setting.size_scale, 1.0))
    return replace(setting, jobs=tuple(replace(j, weight=w) for j, w in zip(setting.jobs, weights)))


def cpu_waits(setting: JobsSetting, index: int, layers: int) -> tuple[float, float]:
    """(one wake-up of job `index`'s replay thread, one step of its ring collectives): seconds each waits
    for a CPU. Measured per wake-up (`wake_wait_s`, `step_wait_s`): a step's slice wakes two of the rank's
    threads in turn (the receiving one, which adds it, then the sending one, which forwards it). A record
    with only the wait per iteration (`cpu_wait_s`) spreads it over the replay's 2 x layers wake-ups, and a
    step waits as long as one of them."""
    if setting.wake_wait_s is not None and setting.step_wait_s is not None:
        return setting.wake_wait_s[index], RING_STEP_WAKEUPS * setting.step_wait_s[index]
    if setting.cpu_wait_s is not None:
        spread = setting.cpu_wait_s[index] / (2 * layers)
        return spread, spread
    return 0.0, 0.0


def _job_compute_s(setting: JobsSetting, index: int, profile: LayerProfile) -> float:
    if setting.compute_s is not None:
        return setting.compute_s[index]
    return (profile.forward_ns + profile.backward_ns) * 1e-9 * setting.compute_scale


@dataclass
class _Chunk:
    job: int
    kind: str              # push, pull, ring, background
    layer: int
    cls: str               # network class name
    order: tuple           # sender's order inside its stream
    bits: float
    ports: tuple[str, ...]
    connections: int       # TCP connections it moves on at once
    done: object = None    # callback(now)
    flow: int = 0          # which of the stream's connections (a vanilla PS tensor's server)
    window: float = 1.0    # bytes in flight per connection, relative to a job's (JobsSetting.background_window)
    hold_s: float = 0.0    # after its bytes, its job's threads work this long on it before it is done; no
    #                        other held chunk of the job moves meanwhile (the threads share one interpreter)

    @property
    def stream(self) -> tuple:
        return (self.job, self.kind, self.cls, self.flow)


@dataclass
class _Stream:
    queue: list = field(default_factory=list)    # heap of (order, seq, chunk)

    def head(self):
        return self.queue[0][2] if self.queue else None


class _Fabric:
    """The representative host's ports and the classes every port serves (one policy)."""

    def __init__(self, setting: JobsSetting, policy: str):
        self.setting = setting
        self.policy = policy
        rate = setting.payload_bps
        crosses = setting.hosts > setting.hosts_per_leaf
        self.capacity = {"up": rate, "down": rate}
        if crosses:
            self.capacity.update(spine_up=rate / setting.oversubscription,
                                 spine_down=rate / setting.oversubscription)
        self.ps_cross = 2 * setting.workers > setting.hosts_per_leaf    # servers on other leaves
        self.ring_cross = setting.workers > setting.hosts_per_leaf      # a ring hop leaves the leaf
        self.background_cross = crosses
        fabric = policy.startswith("fabric")
        weighted = policy == "fabric+weights"
        tenants = Tenants("sim", tuple(Tenant(f"job{i}", j.weight if weighted else 1.0)
                                       for i, j in enumerate(setting.jobs)), setting.background_percent)
        self.profile = tenant_profile(tenants)
        if fabric:
            levels = tenants.levels()
            names = [c.name for c in self.profile.classes]
            self.urgent_class = [names[levels.index(t.weight)] for t in tenants.tenants]
            self.classes = list(self.profile.classes)
        else:
            self.urgent_class = [BULK] * len(setting.jobs)
            self.classes = [c for c in self.profile.classes if c.name == BULK]
        self.fabric = fabric
        self.rank = {c.name: i for i, c in enumerate(self.classes)}

    def net_class(self, job: int, tensor_class: int) -> str:
        return self.urgent_class[job] if tensor_class == 0 else BULK

    def background_class(self) -> str:
        return BACKGROUND if self.fabric else BULK

    def port_shares(self, port: str, heads: list[_Chunk]) -> dict[int, float]:
        """bits/s per head chunk (by id) on `port`: HTB guaranteed rates, the rest to the highest present
        level, per connection inside a class."""
        capacity = self.capacity[port]
        present = {}
        for chunk in heads:
            present.setdefault(chunk.cls, []).append(chunk)
        if not present:
            return {}
        if len(self.classes) == 1:
            class_bw = {BULK: capacity}
        else:
            guaranteed = dict(zip((c.name for c in self.classes), class_rates(self.profile, capacity)))
            class_bw = {name: guaranteed[name] for name in present}
            spare = capacity - sum(class_bw.values())
            strict = [c for c in self.classes if c.strict and c.name in present]
            if strict:
                class_bw[strict[0].name] += spare
            else:
                weighted = [c for c in self.classes if c.scheduler != STRICT and c.name in present]
                total = sum(c.weight or 1 for c in weighted)
                for c in weighted:
                    class_bw[c.name] += spare * (c.weight or 1) / total
        shares = {}
        for name, chunks in present.items():
            held = sum(c.connections * c.window for c in chunks)
            for chunk in chunks:
                shares[id(chunk)] = class_bw[name] * chunk.connections * chunk.window / held
        return shares


class _Job:
    """One job's representative worker: compute through its layers, its chunks in flight."""

    def __init__(self, sim: "_Sim", index: int, job: JobMix, profile: LayerProfile):
        self.sim, self.index, self.job = sim, index, job
        setting = sim.setting
        self.layers = profile.layers
        scale = setting.compute_scale
        if setting.compute_s is not None:    # measured compute: the profile's shape, the measured total
            scale = setting.compute_s[index] / ((profile.forward_ns + profile.backward_ns) * 1e-9)
        self.compute_s = (profile.forward_ns + profile.backward_ns) * 1e-9 * scale   # the GPU's, utilisation's
        # A shared CPU: every wake-up of the replay's thread (it sleeps once per layer and direction, and
        # wakes when a blocked wait ends) waits `wake_s` for a CPU, and every step of a ring collective
        # `step_wait_s`.
        self.wake_s, step_wait_s = cpu_waits(setting, index, len(self.layers))
        # a collective's 2(W-1) steps, each a slice its rank's threads receive, add and forward
        self.collective_hold_s = 2 * (setting.workers - 1) * (setting.ring_step_s + step_wait_s)
        self.clock = 0.0                 # the replay's deadline chain (geryon.categorize.replay)
        self.blocked_from: float | None = None
        self.forward_s = [layer.forward_ns * 1e-9 * scale for layer in self.layers]
        self.backward_s = [layer.backward_ns * 1e-9 * scale for layer in self.layers]
        ranking = profile.ranking()
        classes = threshold_split(ranking, [THRESHOLD], metric="position", max_classes=2).class_of
        index_of = {layer.name: i for i, layer in enumerate(self.layers)}
        self.tensor_class = {index_of[p.name]: c for p, c in zip(ranking, classes)}
        self.tensor_of = {index_of[p.name]: tensor for tensor, p in enumerate(ranking)}
        self.bits = {i: layer.param_bytes * setting.size_scale * 8 for i, layer in enumerate(self.layers)
                     if layer.param_bytes > 0}
        self.ready: set[int] = set(self.bits)        # parameters available for the next forward
        self.pushed: set[int] = set()
        self.backward_done = False       # the pull of this iteration's pushes is asked for once it is
        self.iteration = 0
        self.step_start = 0.0
        self.steps: list[float] = []
        self.waiting_for: int | None = None
        self.arrivals = 0

    # -- compute ------------------------------------------------------------------------------
    def start_iteration(self, now: float) -> None:
        self.step_start = now
        self.clock = now
        self.forward(0, now)

    def layer_end(self, computing: float, duration: float) -> float:
        """When a layer that starts computing at `computing` ends, as `ReplayedModel` runs it: its deadline
        chains from the previous layer's, not from its start; a layer that sleeps toward its deadline
        wakes a CPU wait late (less the busy-wait margin); one already behind its deadline runs on."""
        self.clock += duration
        if self.clock - computing > BENCH_SPIN_MARGIN_S:
            return self.clock + max(0.0, self.wake_s - BENCH_SPIN_MARGIN_S)
        return max(self.clock, computing)

    def forward(self, layer: int, now: float) -> None:
        if layer == len(self.layers):   # every pull of the last iteration landed: its pushes are done
            self.backward_done = False
            self.clock = now
            self.backward(len(self.layers) - 1, now)
            return
        if layer in self.bits and layer not in self.ready:
            self.waiting_for = layer
            if self.blocked_from is None:
                self.blocked_from = now
            return
        self.ready.discard(layer)
        if self.blocked_from is not None:    # woken: waits for a CPU; the wait pushes the schedule back
            now += self.wake_s
            self.clock += now - self.blocked_from
            self.blocked_from = None
        self.sim.at(self.layer_end(now, self.forward_s[layer]), lambda t: self.forward(layer + 1, t))

    def backward(self, layer: int, now: float) -> None:
        def end(t):
            if layer in self.bits:
                self.gradient(layer, t)
            if layer == 0:
                self.end_backward(t)
            else:
                self.backward(layer - 1, t)
        self.sim.at(self.layer_end(now, self.backward_s[layer]), end)

    def end_backward(self, now: float) -> None:
        self.steps.append(now - self.step_start)
        self.backward_done = True
        if self.job.kind == "ps":
            for layer in sorted(self.pushed):
                self.pull(layer)
            self.pushed = set()
        self.iteration += 1
        setting = self.sim.setting
        if setting.segments and self.iteration == setting.warmup:
            self.sim.warmed(self.index, now)      # the measured iterations start together
            return
        if self.iteration >= setting.warmup + setting.iterations:
            self.sim.finished(self.index)
            if setting.segments or not self.sim.running:
                return
        self.start_iteration(now)               # steady: keep the others company until they are done

    def param_arrived(self, layer: int, now: float) -> None:
        self.ready.add(layer)
        if self.waiting_for == layer:
            self.waiting_for = None
            self.forward(layer, now)

    # -- communication ------------------------------------------------------------------------
    def gradient(self, layer: int, now: float) -> None:
        sim, setting = self.sim, self.sim.setting
        cls = sim.fabric.net_class(self.index, self.tensor_class[layer])
        order = (0,) if sim.policy == "vanilla" else (self.tensor_class[layer],)
        self.arrivals += 1
        order += (self.arrivals,)
        if self.job.kind == "ps":
            ports = ("up",) + (("spine_up",) if sim.fabric.ps_cross and "spine_up" in sim.fabric.capacity else ())
            connections, server = self.ps_flow(layer)
            sim.send(_Chunk(self.index, "push", layer, cls, order, self.bits[layer], ports, connections,
                            done=lambda t: self.push_done(layer, t), flow=server))
        else:
            world = setting.workers
            ports = ("up", "down")
            if sim.fabric.ring_cross and "spine_up" in sim.fabric.capacity:
                ports += ("spine_up", "spine_down")
            sim.send(_Chunk(self.index, "ring", layer, cls, order, self.bits[layer] * 2 * (world - 1) / world,
                            ports, 1, done=lambda t: self.param_arrived(layer, t),
                            hold_s=self.collective_hold_s))

    def push_done(self, layer: int, now: float) -> None:
        if self.backward_done:            # the pull was asked for already: the server answers now
            self.pull(layer)
        else:
            self.pushed.add(layer)

    def pull(self, layer: int) -> None:
        sim = self.sim
        cls = sim.fabric.net_class(self.index, self.tensor_class[layer])
        self.arrivals += 1
        order = ((0,) if sim.policy == "vanilla" else (self.tensor_class[layer],)) + (self.arrivals,)
        ports = ("down",) + (("spine_down",) if sim.fabric.ps_cross and "spine_down" in sim.fabric.capacity else ())
        connections, server = self.ps_flow(layer)
        sim.send(_Chunk(self.index, "pull", layer, cls, order, self.bits[layer], ports, connections,
                        done=lambda t: self.param_arrived(layer, t), flow=server))

    def ps_flow(self, layer: int) -> tuple[int, int]:
        """(connections, server) a PS tensor moves on: whole, on server tensor % servers, where the policy
        keeps tensors whole (vanilla); else sliced over every server's connection at once."""
        servers = self.sim.setting.workers
        if get_policy(TRANSPORT_POLICY[self.sim.policy]).spread_over_servers:
            return servers, 0
        return 1, self.tensor_of[layer] % servers


class _Sim:
    def __init__(self, setting: JobsSetting, policy: str):
        if policy not in POLICIES:
            raise ConfigError(f"unknown policy {policy!r}: choose from {', '.join(POLICIES)}")
        self.setting, self.policy = setting, policy
        self.fabric = _Fabric(setting, policy)
        self.now = 0.0
        self.timers: list = []
        self.seq = 0
        self.streams: dict[tuple, _Stream] = {}
        self.held_until: dict[int, float] = {}   # per job: its threads work on a held chunk until then
        self.running = set(range(len(setting.jobs)))
        self.waiting: set[int] = set()
        self.settling = False
        self.jobs = [_Job(self, i, job, profile) for i, (job, profile)
                     in enumerate(zip(setting.jobs, job_profiles(setting)))]
        self.background_bits = 0.0
        self.measure_from: float | None = None
        self.background = None
        if setting.background:
            ports = ("down",) + (("spine_down",) if self.fabric.background_cross else ())
            self.background = _Chunk(-1, "background", -1, self.fabric.background_class(), (0,), math.inf,
                                     ports, 1, window=setting.background_window)

    def at(self, when: float, callback) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (when, self.seq, callback))

    def send(self, chunk: _Chunk) -> None:
        self.seq += 1
        heapq.heappush(self.streams.setdefault(chunk.stream, _Stream()).queue, (chunk.order, self.seq, chunk))

    def finished(self, index: int) -> None:
        self.running.discard(index)

    def warmed(self, index: int, now: float) -> None:
        self.waiting.add(index)
        self.settling = len(self.waiting) == len(self.jobs)

    def settled(self) -> bool:
        """Every job has done its warm-up and every transfer of it has landed: the bench starts the
        background and waits for its connection between the two runs, so the measured iterations start
        with every parameter in place."""
        return self.settling and not self.timers and not any(s.queue for s in self.streams.values())

    def heads(self) -> list[_Chunk]:
        heads = [s.head() for s in self.streams.values()
                 if s.queue and self.held_until.get(s.head().job, 0.0) <= self.now + 1e-12]
        if self.background is not None and self.running and (self.measure_from is not None
                                                             or not self.setting.segments):
            heads.append(self.background)
        return heads

    def rates(self, heads: list[_Chunk]) -> dict[int, float]:
        per_port = {}
        for port in self.fabric.capacity:
            on_port = [c for c in heads if port in c.ports]
            per_port[port] = self.fabric.port_shares(port, on_port)
        return {id(c): min(per_port[p][id(c)] for p in c.ports) for c in heads}

    def run(self) -> dict:
        for job in self.jobs:
            job.start_iteration(0.0)
        while self.running:
            if self.settled():
                self.settling = False
                self.measure_from = self.now
                for job in self.jobs:
                    job.start_iteration(self.now)
            heads = self.heads()
            rates = self.rates(heads)
            next_timer = self.timers[0][0] if self.timers else math.inf
            finish = min(((c.bits / rates[id(c)], c) for c in heads if c.kind != "background" and rates[id(c)] > 0),
                         default=(math.inf, None), key=lambda x: x[0])
            step = min(next_timer - self.now, finish[0])
            if step == math.inf:
                raise ConfigError("the simulated jobs stalled: no transfer moves and no compute runs")
            self._advance(heads, rates, step)
            done = [c for c in heads if c.kind != "background" and c.bits <= EPSILON_BITS]
            for chunk in done:
                heapq.heappop(self.streams[chunk.stream].queue)
            for chunk in done:
                if chunk.hold_s > 0:      # the job's threads work on it, one chunk at a time
                    until = max(self.now, self.held_until.get(chunk.job, 0.0)) + chunk.hold_s
                    self.held_until[chunk.job] = until
                    self.at(until, chunk.done)
                else:
                    chunk.done(self.now)
            while self.timers and self.timers[0][0] <= self.now + 1e-12:
                _, _, callback = heapq.heappop(self.timers)
                callback(self.now)
        return self.result()

    def _advance(self, heads, rates, step: float) -> None:
        for chunk in heads:
            moved = rates[id(chunk)] * step
            if chunk.kind == "background":
                if self.measure_from is not None:
                    self.background_bits += moved
            else:
                chunk.bits -= moved
        self.now += step
        if (self.measure_from is None and not self.setting.segments
                and all(j.iteration >= self.setting.warmup for j in self.jobs)):
            self.measure_from = self.now

    def result(self) -> dict:
        s = self.setting
        jobs = []
        for job in self.jobs:
            steps = job.steps[s.warmup:s.warmup + s.iterations]
            iteration = statistics.median(steps)
            jobs.append({"job": f"{job.job.model}-{job.job.kind}-{job.index}", "median_iteration_s": iteration,
                         "compute_s": job.compute_s, "utilisation": job.compute_s / statistics.mean(steps)})
        wall = sum(statistics.mean(j.steps[s.warmup:s.warmup + s.iterations]) for j in self.jobs)
        compute = sum(j.compute_s for j in self.jobs)
        elapsed = self.now - (self.measure_from or 0.0)
        share = None
        if s.background and elapsed > 0:
            share = self.background_bits / elapsed / s.payload_bps
        return {"policy": self.policy, "jobs": jobs, "aggregate_utilisation": compute / wall,
                "background_share": share, "seconds": self.now}


def simulate_jobs(setting: JobsSetting, policy: str) -> dict:
    """Per job its median iteration and utilisation, the aggregate utilisation (compute over wall summed
    over jobs' workers: the workers are symmetric), the background's share of the payload rate."""
    if policy == "fabric+weights":
        setting = with_weights(setting)
    return _Sim(setting, policy).run()


def setting_from_record(record: dict) -> JobsSetting:
    """The JobsSetting a `geryon bench tenants` record was measured with: its jobs, rate, scales, and each
    job's replayed compute per iteration (the mean of its workers' nominal)."""
    from geryon.rates import parse_rate

    s = record["settings"]
    return JobsSetting(jobs=tuple(JobMix.parse(m) for m in s["models"]), workers=s["workers"],
                       rate_bps=parse_rate(s["rate"]), size_scale=s["size_scale"], compute_scale=s["time_scale"],
                       background=s["background"], background_percent=s["background_percent"],
                       iterations=s["iterations"], warmup=s["warmup"], segments=True,
                       frame_bytes=EMULATED_FRAME_BYTES, background_window=EMULATED_BACKGROUND_WINDOW,
                       ring_step_s=EMULATED_RING_STEP_S,
                       compute_s=tuple(statistics.mean(c) for c in record["compute_s"]))


def repetition_cpu_waits(row: dict) -> dict:
    """The JobsSetting fields for the CPU waits one repetition of a bench record measured: per wake-up
    where it counted the wake-ups (`wake_wait_s`, `wake_wait_all_s`), else per iteration (`cpu_wait_s`)."""
    jobs = row["jobs"]
    if all(j.get("wake_wait_s") is not None and j.get("wake_wait_all_s") is not None for j in jobs):
        return {"wake_wait_s": tuple(j["wake_wait_s"] for j in jobs),
                "step_wait_s": tuple(j["wake_wait_all_s"] for j in jobs)}
    if all(j.get("cpu_wait_s") is not None for j in jobs):
        return {"cpu_wait_s": tuple(j["cpu_wait_s"] for j in jobs)}
    raise ConfigError("this record has no per-job CPU wait (cpu_wait_s): compare without --cpu-wait")


def check_same_bench(settings: list[JobsSetting]) -> None:
    """Several records compare together only when they ran the same bench (jobs, workers, rate, scales,
    iterations); each keeps its own measured compute."""
    benches = [replace(setting, compute_s=None) for setting in settings]
    if any(other != benches[0] for other in benches[1:]):
        raise ConfigError("records of different benches (jobs, workers, rate, scales or iterations differ): "
                          "compare them one at a time")


def compare_record(record: dict | list[dict], cpu_wait: bool = False) -> list[dict]:
    """Simulated beside measured, per policy and job: iteration time, utilisation, background share, and the
    simulation's relative error on the iteration time and the aggregate utilisation.

    Every repetition of every record is simulated (with `cpu_wait`: with the CPU waits that repetition
    measured, `repetition_cpu_waits`), and each cell compares the median over the repetitions, simulated
    against measured. Several records of the same bench pool their repetitions: on 2 shared cores one
    record's three leave a cell's median uncertain by more than 10% (the ring job's most of all)."""
    records = record if isinstance(record, list) else [record]
    settings = [setting_from_record(one) for one in records]
    check_same_bench(settings)
    simulated: dict[str, list[dict]] = {}
    measured: dict[str, list[dict]] = {}
    results: dict[tuple, dict] = {}   # repetitions with the same inputs (all of them without cpu_wait) run once
    for one, setting in zip(records, settings):
        for row in one["rows"]:
            waits = repetition_cpu_waits(row) if cpu_wait else {}
            inputs = replace(setting, **waits)
            key = (inputs, row["policy"])
            if key not in results:
                results[key] = simulate_jobs(inputs, row["policy"])
            simulated.setdefault(row["policy"], []).append(results[key])
            measured.setdefault(row["policy"], []).append(row)
    rows = []
    for policy, runs in measured.items():
        sims = simulated[policy]
        for index, job in enumerate(runs[0]["jobs"]):
            sim_s = statistics.median(s["jobs"][index]["median_iteration_s"] for s in sims)
            emu_s = statistics.median(r["jobs"][index]["median_iteration_s"] for r in runs)
            rows.append({"policy": policy, "job": job["job"], "sim_iteration_s": sim_s, "emu_iteration_s": emu_s,
                         "iteration_error": sim_s / emu_s - 1,
                         "sim_utilisation": statistics.median(s["jobs"][index]["utilisation"] for s in sims),
                         "emu_utilisation": statistics.median(r["jobs"][index]["utilisation"] for r in runs),
                         "repetitions": len(runs)})
        sim_u = statistics.median(s["aggregate_utilisation"] for s in sims)
        emu_u = statistics.median(r["aggregate_utilisation"] for r in runs)
        shares = [r["background_share"] for r in runs if r.get("background_share") is not None]
        sim_shares = [s["background_share"] for s in sims if s["background_share"] is not None]
        rows.append({"policy": policy, "job": "aggregate", "sim_utilisation": sim_u, "emu_utilisation": emu_u,
                     "utilisation_error": sim_u / emu_u - 1,
                     "sim_background_share": statistics.median(sim_shares) if sim_shares else None,
                     "emu_background_share": statistics.median(shares) if shares else None,
                     "repetitions": len(runs)})
    return rows


def compare_table(rows: list[dict]) -> str:
    lines = [f"{'policy':<15} {'job':<22} {'sim s':>8} {'emu s':>8} {'error':>7}  {'sim util':>8} {'emu util':>8}"
             f" {'error':>7}  background sim/emu"]
    for r in rows:
        if r["job"] == "aggregate":
            bg = ("" if r["sim_background_share"] is None else
                  f"  {r['sim_background_share']:.1%} / {r['emu_background_share']:.1%}")
            lines.append(f"{r['policy']:<15} {'aggregate':<22} {'':>8} {'':>8} {'':>7}  {r['sim_utilisation']:8.3f}"
                         f" {r['emu_utilisation']:8.3f} {r['utilisation_error']:+7.1%}{bg}")
        else:
            lines.append(f"{r['policy']:<15} {r['job']:<22} {r['sim_iteration_s']:8.3f} {r['emu_iteration_s']:8.3f}"
                         f" {r['iteration_error']:+7.1%}  {r['sim_utilisation']:8.3f} {r['emu_utilisation']:8.3f}")
    return "\n".join(lines)


def whatif(base: JobsSetting, mixes: dict[str, tuple[JobMix, ...]], oversubscriptions) -> dict:
    """Aggregate utilisation per policy across job mixes (at base's oversubscription) and across
    oversubscriptions (at the last mix): {"jobs": {policy: [...]}, "oversubscription": {policy: [...]}}."""
    out = {"mixes": list(mixes), "oversubscriptions": list(oversubscriptions), "jobs": {}, "oversubscription": {}}
    for policy in POLICIES:
        out["jobs"][policy] = [simulate_jobs(replace(base, jobs=mix), policy)["aggregate_utilisation"]
                               for mix in mixes.values()]
        last = list(mixes.values())[-1]
        out["oversubscription"][policy] = [
            simulate_jobs(replace(base, jobs=last, oversubscription=r), policy)["aggregate_utilisation"]
            for r in oversubscriptions]
    return out


WHATIF_MIXES = {"1 job": ("vgg19",), "2 jobs": ("vgg19", "resnet50:allreduce"),
                "3 jobs": ("vgg19", "resnet50:allreduce", "resnet50")}
WHATIF_OVERSUBSCRIPTION = (1, 2, 4, 8)


def setting_from_args(args) -> JobsSetting:
    from geryon.sim.paper import LINKS

    if args.bw is not None and not 1 <= args.bw <= 400:
        raise ConfigError(f"--bw must be 1-400 Gbit/s, got {args.bw:g}")
    if args.cpu_wait:
        raise ConfigError("--cpu-wait takes its waits from a record: give it with --compare")
    if not 0 < args.size_scale <= 1:
        raise ConfigError(f"--size-scale is a byte scale in (0, 1], got {args.size_scale:g}")
    return JobsSetting(jobs=tuple(JobMix.parse(text) for text in args.jobs.split(",") if text.strip()),
                       workers=args.workers, rate_bps=args.bw * 1e9 if args.bw else LINKS[args.link],
                       size_scale=args.size_scale, compute_scale=args.compute_scale or 1.0,
                       oversubscription=args.oversubscription, hosts_per_leaf=args.hosts_per_leaf or 16,
                       background=not args.no_background, background_percent=args.background_percent,
                       iterations=args.iterations)


def policy_table(results: list[dict]) -> str:
    lines = []
    for r in results:
        share = "" if r["background_share"] is None else f"  background {r['background_share']:.1%}"
        jobs = "  ".join(f"{j['job']} {j['median_iteration_s'] * 1e3:.1f} ms ({j['utilisation']:.2f})"
                         for j in r["jobs"])
        lines.append(f"{r['policy']:<15} aggregate utilisation {r['aggregate_utilisation']:.3f}  {jobs}{share}")
    return "\n".join(lines)


def run_jobs(args) -> int:
    """`geryon sim --jobs ...`: the mix under every policy; with --compare a tenants bench record beside
    its simulation; with --out the what-if curves (jobs, oversubscription)."""
    import json

    if args.compare:
        records = []
        for path in args.compare:
            with open(path) as handle:
                record = json.load(handle)
            if "rows" not in record or "compute_s" not in record:
                raise ConfigError(f"{path} is not a `geryon bench tenants --json` record")
            records.append(record)
        rows = compare_record(records, cpu_wait=args.cpu_wait)
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        print(compare_table(rows))
        errors = [abs(r["iteration_error"]) for r in rows if "iteration_error" in r]
        utilisation = [abs(r["utilisation_error"]) for r in rows if "utilisation_error" in r]
        loads = ", ".join(f"{r['load_average']['before']:.1f}" for r in records)
        print(f"largest error: iteration time {max(errors):.1%}, aggregate utilisation {max(utilisation):.1%} "
              f"({rows[0]['repetitions']} repetitions per policy from {len(records)} record(s); load average "
              f"when measured: {loads} on {records[0]['cpus']} cores)")
        return 0
    if not args.jobs:
        raise ConfigError("--jobs needs a mix (e.g. --jobs vgg19,resnet50:allreduce) unless --compare gives a record")
    setting = setting_from_args(args)
    results = [simulate_jobs(setting, policy) for policy in POLICIES]
    if args.json:
        print(json.dumps({"hosts": setting.hosts, "results": results}, indent=1))
    else:
        print(f"{len(setting.jobs)} jobs x {setting.workers} workers on {setting.hosts} hosts, "
              f"{setting.rate_bps / 1e9:g} Gbit/s links, oversubscription {setting.oversubscription:g}:1, "
              f"{setting.hosts_per_leaf} hosts per leaf, size scale {setting.size_scale:g}")
        print(policy_table(results))
    if args.out:
        write_whatif(setting, args.out)
        print(f"wrote {args.out}/jobs_whatif.json, jobs_vs_mix.png, jobs_vs_oversubscription.png", file=sys.stderr)
    return 0


def write_whatif(base: JobsSetting, out) -> dict:
    import json
    from pathlib import Path

    from geryon.sim.report import line_chart

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mixes = {name: tuple(JobMix.parse(m) for m in models) for name, models in WHATIF_MIXES.items()}
    curves = whatif(base, mixes, WHATIF_OVERSUBSCRIPTION)
    curves["setting"] = {"workers": base.workers, "rate_bps": base.rate_bps, "size_scale": base.size_scale,
                         "oversubscription": base.oversubscription, "hosts_per_leaf": base.hosts_per_leaf}
    (out / "jobs_whatif.json").write_text(json.dumps(curves, indent=1) + "\n")
    xs = list(range(1, len(mixes) + 1))
    line_chart({p: (xs, curves["jobs"][p]) for p in POLICIES}, out / "jobs_vs_mix.png",
               f"aggregate utilisation vs jobs ({base.workers} workers each, "
               f"{base.oversubscription:g}:1)", "jobs (vgg19 PS, + resnet50 ring, + resnet50 PS)",
               "aggregate GPU-time utilisation")
    line_chart({p: (list(WHATIF_OVERSUBSCRIPTION), curves["oversubscription"][p]) for p in POLICIES},
               out / "jobs_vs_oversubscription.png",
               f"aggregate utilisation vs oversubscription ({len(mixes)} jobs, {base.workers} workers each)",
               "oversubscription (R:1)", "aggregate GPU-time utilisation")
    return curves
