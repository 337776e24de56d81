"""The simulator's model of allreduce mode: DDP's buckets on a ring, in class order, and the next forward.

    row = simulate_ring(RingSetting(model="vgg19", workers=8, bw_bps=10e9, compute_scale=11.0),
                        "geryon", overlap="next-forward")

What it models, as `geryon bench paper --mode allreduce` runs it (geryon.bench.replay_ddp):
  buckets   the tensors (one per profiled layer with parameters) in backward order, cut at DDP's
            25 MiB and wherever the class changes; `vanilla` and `slicing` have no classes (cut by
            size only), `endhost` and `geryon` take the coarse CONV/FC split. A bucket is ready when
            backward has produced its last gradient.
  the ring  every link carries 2(n-1)/n x a bucket's bytes (reduce-scatter then all-gather, each rank
            sending one chunk per step to its right neighbour, every link busy at once on a
            non-blocking switch), so the ring is one server of rate `payload_rate(bw)` working
            through 2(n-1)/n x bytes per bucket. Order: `endhost` and `geryon` order every flow's
            send queue by class before collective (`Policy.collective_key`; `geryon` also gives each
            class a DSCP-marked flow of its own), so an urgent bucket preempts bulk on every link
            (strict priority, preemptive, FIFO within a class); `vanilla` and `slicing` send
            collective after collective.
  the step  barrier: the next forward starts once every bucket is reduced (DDP); next-forward: each
            layer's forward waits for its own bucket only, so the first layers compute while the
            late (big) buckets still travel.
Iteration time = forward start to the next forward start, in steady state (no bucket of an iteration
is still in flight when the next backward starts: every forward layer waited for its own).

`compare_ring(rows)` puts this beside `bench paper --mode allreduce` rows: the same model, workers,
link and compute scale per row; the error is (simulated - measured) / measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from geryon.categorize.classes import coarse_split
from geryon.categorize.profiles import LayerProfile, resolve_profile
from geryon.errors import ConfigError
from geryon.sim.scenario import payload_rate
from geryon.transport.policy import POLICIES, get_policy

DDP_BUCKET_BYTES = 25 * 1024 * 1024   # DistributedDataParallel's bucket_cap_mb
OVERLAPS = ("barrier", "next-forward")
TARGET_ERROR = 0.10                   # the allreduce model's validation target against the emulated cells


@dataclass(frozen=True)
class RingSetting:
    """One simulated allreduce cell's machine: model, ring size, link rate, compute scale."""
    model: str = "vgg19"
    workers: int = 8
    bw_bps: float = 10e9
    compute_scale: float = 11.0
    batch: int = 32
    mtu: int = 1500
    bucket_bytes: int = DDP_BUCKET_BYTES

    def __post_init__(self):
        if self.workers < 2:
            raise ConfigError(f"a ring needs at least 2 workers, got {self.workers}")
        if self.bw_bps <= 0 or self.compute_scale <= 0:
            raise ConfigError("need a link rate > 0 and a compute scale > 0")

    def profile(self) -> LayerProfile:
        return resolve_profile(self.model, batch=self.batch)


@dataclass(frozen=True)
class RingBucket:
    tensors: tuple[int, ...]     # tensor indices (forward order) in the bucket, backward order
    nbytes: int
    cls: int                     # 0 most urgent


def ring_buckets(profile: LayerProfile, policy: str, bucket_bytes: int = DDP_BUCKET_BYTES) -> list[RingBucket]:
    """The buckets in launch (backward) order, cut at `bucket_bytes` and where the class changes."""
    ranking = profile.ranking()
    chosen = get_policy(policy)
    if chosen.flow_per_class or chosen.urgency_order:
        classes = list(coarse_split(ranking, max_classes=2).class_of)
    else:
        classes = [0] * len(ranking)
    buckets, current, size = [], [], 0
    for tensor in reversed(range(len(ranking))):
        nbytes = ranking[tensor].bytes
        if current and (size + nbytes > bucket_bytes or classes[tensor] != classes[current[0]]):
            buckets.append(RingBucket(tuple(current), size, classes[current[0]]))
            current, size = [], 0
        current.append(tensor)
        size += nbytes
        if size >= bucket_bytes:
            buckets.append(RingBucket(tuple(current), size, classes[current[0]]))
            current, size = [], 0
    if current:
        buckets.append(RingBucket(tuple(current), size, classes[current[0]]))
    return buckets


def ring_finish_times(ready: list[float], work_s: list[float], classes: list[int], preemptive: bool) -> list[float]:
    """When each bucket's reduction ends on a ring that is one server: bucket i becomes ready at
    ready[i] and needs work_s[i] seconds of it. Preemptive: the lowest class ready goes first, and
    takes the ring from a bulk bucket mid-way (FIFO within a class); else strictly in launch order."""
    count = len(ready)
    left = list(work_s)
    done = [0.0] * count
    if not preemptive:
        t = 0.0
        for i in range(count):
            t = max(t, ready[i]) + left[i]
            done[i] = t
        return done
    pending = set(range(count))
    t = min(ready) if ready else 0.0
    while pending:
        waiting = [i for i in pending if ready[i] <= t + 1e-15]
        if not waiting:
            t = min(ready[i] for i in pending)
            continue
        current = min(waiting, key=lambda i: (classes[i], i))
        arrivals = [ready[i] for i in pending if ready[i] > t and classes[i] < classes[current]]
        until = min([t + left[current]] + arrivals)
        left[current] -= until - t
        t = until
        if left[current] <= 1e-12:
            done[current] = t
            pending.discard(current)
    return done


def simulate_ring(setting: RingSetting, policy: str, overlap: str = "barrier", iterations: int = 4,
                  profile: LayerProfile | None = None) -> dict:
    """One cell: steady-state iteration seconds, images/s and scaling efficiency, as a bench row
    (`profile`: another model's layers than setting.model's profile)."""
    if overlap not in OVERLAPS:
        raise ConfigError(f"overlap {overlap!r}: choose {' or '.join(OVERLAPS)}")
    if iterations < 3:
        raise ConfigError("the steady state needs at least 3 simulated iterations")
    profile = profile or setting.profile()
    ranking = profile.ranking()
    layer_tensor = {p.name: i for i, p in enumerate(ranking)}
    buckets = ring_buckets(profile, policy, setting.bucket_bytes)
    bucket_of = {t: b for b, bucket in enumerate(buckets) for t in bucket.tensors}
    rate = payload_rate(setting.bw_bps, setting.mtu) / 8          # bytes/s on every link of the ring
    share = 2 * (setting.workers - 1) / setting.workers
    work = [share * bucket.nbytes / rate for bucket in buckets]
    preemptive = get_policy(policy).urgency_order
    forward = [layer.forward_ns * 1e-9 * setting.compute_scale for layer in profile.layers]
    backward = [layer.backward_ns * 1e-9 * setting.compute_scale for layer in profile.layers]
    landed = [0.0] * len(buckets)      # when the previous iteration's buckets were reduced
    starts = []
    t = 0.0
    for _ in range(iterations):
        starts.append(t)
        for index, layer in enumerate(profile.layers):
            tensor = layer_tensor.get(layer.name)
            if tensor is not None:
                t = max(t, max(landed) if overlap == "barrier" else landed[bucket_of[tensor]])
            t += forward[index]
        produced = {}
        for index in reversed(range(len(profile.layers))):
            t += backward[index]
            tensor = layer_tensor.get(profile.layers[index].name)
            if tensor is not None:
                produced[tensor] = t
        ready = [max(produced[x] for x in bucket.tensors) for bucket in buckets]
        landed = ring_finish_times(ready, work, [b.cls for b in buckets], preemptive)
    iteration = starts[-1] - starts[-2]
    compute = sum(forward) + sum(backward)
    return {"model": setting.model, "policy": policy, "overlap": overlap, "workers": setting.workers,
            "bw_bits": setting.bw_bps, "compute_scale": setting.compute_scale, "buckets": len(buckets),
            "iteration_s": iteration, "compute_s": compute, "scaling_efficiency": compute / iteration,
            "images_per_s": setting.workers * setting.batch / iteration,
            "ring_s": sum(work)}


def cell_name(policy: str, overlap: str) -> str:
    """The bench's name of a cell: "geryon" (barrier) or "geryon+overlap"."""
    return policy if overlap == "barrier" else f"{policy}+overlap"


def split_cell(name: str) -> tuple[str, str]:
    """"geryon+overlap" -> ("geryon", "next-forward"); other options are not modelled (ConfigError)."""
    base, *options = name.split("+")
    if base not in POLICIES or any(option != "overlap" for option in options):
        raise ConfigError(f"cell {name!r}: the ring model knows {', '.join(POLICIES)}, each optionally +overlap")
    return base, "next-forward" if options else "barrier"


def compare_ring(rows: list[dict]) -> tuple[list[dict], int]:
    """Simulated beside measured for every allreduce row of `bench paper` (JSON rows); skipped count."""
    results, skipped = [], 0
    for row in rows:
        if row.get("mode") != "allreduce" or not row.get("iteration_s") or not row.get("bw_bits"):
            skipped += 1
            continue
        policy, overlap = split_cell(row["policy"])
        setting = RingSetting(model=row["model"], workers=row["workers"], bw_bps=row["bw_bits"],
                              compute_scale=row["time_scale"], batch=row.get("batch", 32))
        sim = simulate_ring(setting, policy, overlap)
        results.append({"model": row["model"], "link": row["link"], "policy": row["policy"],
                        "measured_s": row["iteration_s"], "simulated_s": sim["iteration_s"],
                        "measured_efficiency": row["scaling_efficiency"],
                        "simulated_efficiency": sim["scaling_efficiency"],
                        "error": (sim["iteration_s"] - row["iteration_s"]) / row["iteration_s"]})
    return results, skipped


def comparison_table(results: list[dict]) -> str:
    """Markdown: per cell, simulated and measured iteration seconds and the error."""
    lines = ["| model | link | cell | measured s | simulated s | error | measured eff. | simulated eff. |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['model']} | {r['link']} | {r['policy']} | {r['measured_s']:.3f} | {r['simulated_s']:.3f} | "
                     f"{100 * r['error']:+.1f}% | {100 * r['measured_efficiency']:.1f}% | "
                     f"{100 * r['simulated_efficiency']:.1f}% |")
    if results:
        worst = max(abs(r["error"]) for r in results)
        lines += ["", f"largest error {100 * worst:.1f}% over {len(results)} cells (target within "
                      f"{100 * TARGET_ERROR:.0f}%: {'met' if worst <= TARGET_ERROR else 'not met'})"]
    return "\n".join(lines)
