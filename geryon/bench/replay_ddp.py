"""The replayed allreduce (DDP-like) worker of `geryon bench paper --mode allreduce`.

    python -m geryon.bench.replay_roles ring --rank R --workers W --servers W --model vgg19 ...

A `ReplayedModel` whose gradients are averaged by geryon's ring allreduce (`AllreduceGroup`), bucket
by bucket as DDP does: the tensors are cut into buckets in backward order at DDP's bucket size
(`DDP_BUCKET_BYTES` x the replay's size scale) and wherever the class changes; a bucket starts on the
ring (`allreduce_async`, op "avg", on the flow of its class) as soon as backward has filled it, in the
same order on every rank. A thread per reduction updates that bucket's parameters (plain SGD at
replay_roles' LEARNING_RATE) the moment it lands. Then the next forward waits:
    barrier        at its first layer, for every bucket (DDP: backward ends when the last bucket is
                   reduced, step() updates everything, and the next forward starts after it);
    next-forward   per layer, for the bucket holding that layer's own parameters only
                   (geryon.runtime.ddp_overlap, ByteScheduler's crossing of the iteration boundary):
                   the first layers compute while the big late layers still travel.
Classes: `vanilla` and `slicing` have none (every tensor in one class: DDP's own order, buckets cut by
size only); `endhost` and `geryon` take the replay's split (CONV before FC by default), so an urgent
bucket goes ahead of bulk in the ring's send queues, and under `geryon` on its own class's flow.

Commands as the PS worker's (replay_roles): connect {threshold, peers: [[ip, port], ...], transport:
{..., "overlap": "barrier"|"next-forward"}}, step, run, compute, scale, drain, exit. Every gradient is 1.0
and the average of W ones is exactly 1.0, so after n iterations every parameter is -n x LEARNING_RATE
exactly on every rank (`applied`, checked by the driver): a reduction lost or applied twice shows.
"""

from __future__ import annotations

import hashlib
import threading
import time

from geryon.bench.replay_roles import (LEARNING_RATE, ReplayedWorker, _check_overrides, _config, _priorities,
                                       _save_timeline, _wall, applied_updates, params_digest)
from geryon.errors import ConfigError, TransportError
from geryon.timeline import RankTimeline
from geryon.transport import AllreduceGroup
from geryon.transport.buckets import plan_buckets
from geryon.transport.policy import get_policy

DDP_BUCKET_BYTES = 25 * 1024 * 1024   # DistributedDataParallel's bucket_cap_mb (25), scaled per replay
OVERLAPS = ("barrier", "next-forward")


class _RingBucket:
    """Tensors (backward order) averaged as one flat tensor; `done` once reduced and applied."""

    def __init__(self, tensors: list[int], params, priority: tuple[int, int]):
        import torch

        self.tensors, self.priority = tensors, priority
        sizes = [params[t].numel() for t in tensors]
        self.flat = torch.zeros(sum(sizes), dtype=params[tensors[0]].dtype)
        self.views, at = {}, 0
        for tensor, size in zip(tensors, sizes):
            self.views[tensor] = self.flat[at:at + size]
            at += size
        self.filled = 0
        self.done = threading.Event()
        self.done.set()
        self.error: BaseException | None = None


def ring_buckets(params, priorities, cap_bytes: float) -> list[list[int]]:
    """Tensor indices per bucket, in backward order, cut at `cap_bytes` and where the class changes
    (the transport's plan_buckets over the tensors in reverse)."""
    order = list(reversed(range(len(params))))
    planned = plan_buckets([params[t] for t in order], [priorities[t] for t in order], int(cap_bytes))
    return [[order[entry.index] for entry in bucket.entries] for bucket in planned]


class ReplayedDDPWorker(ReplayedWorker):
    """One rank of a DDP-like ring: the replayed model, its buckets and its (current) AllreduceGroup."""

    def __init__(self, args):
        super().__init__(args)
        self.group: AllreduceGroup | None = None
        self.buckets: list[_RingBucket] = []
        self.bucket_of: dict[int, _RingBucket] = {}
        self.next_launch = 0
        self.overlap = "barrier"

    def connect(self, threshold: float, peers, transport: dict | None = None, trace: str | None = None) -> dict:
        overrides = dict(transport or {})
        self.overlap = overrides.pop("overlap", "barrier")
        if self.overlap not in OVERLAPS:
            raise ConfigError(f"overlap {self.overlap!r}: choose {' or '.join(OVERLAPS)}")
        overrides = _check_overrides(overrides)
        assignment, priorities = _priorities(self.ranking, threshold, self.args, overrides)
        policy = get_policy(overrides.get("policy") or self.args.policy)
        if not (policy.flow_per_class or policy.urgency_order):
            priorities = [(0, 0)] * len(priorities)      # no classes: DDP's own order
        cap = DDP_BUCKET_BYTES * self.args.size_scale
        self.buckets, self.bucket_of, self.next_launch = [], {}, 0
        for tensors in ring_buckets(self.params, priorities, cap):
            prio = min(priorities[t] for t in tensors)
            bucket = _RingBucket(tensors, self.params, prio)
            self.buckets.append(bucket)
            for tensor in tensors:
                self.bucket_of[tensor] = bucket
        self.timeline = RankTimeline(trace, f"worker{self.args.rank}") if trace else None
        tracer = self.timeline.transfer if self.timeline is not None else None
        address = [tuple(peer) for peer in peers]
        self.group = AllreduceGroup(self.args.rank, self.args.workers, address,
                                    _config(self.args, overrides, tracer),
                                    listen=("0.0.0.0", address[self.args.rank][1]))
        plan = hashlib.sha256(repr([(b.tensors, b.priority) for b in self.buckets]).encode()).hexdigest()
        return {"assignment": assignment.digest(), "plan": plan, "buckets": len(self.buckets)}

    # -- backward: buckets onto the ring; reductions applied as they land ----------------------
    def _after_backward(self, _index, name, gradient) -> None:
        if self.offline:
            return
        tensor = self.tensor_of[name]
        bucket = self.bucket_of[tensor]
        bucket.views[tensor].copy_(gradient.view(-1))
        bucket.filled += 1
        while self.next_launch < len(self.buckets) and \
                self.buckets[self.next_launch].filled == len(self.buckets[self.next_launch].tensors):
            self._launch(self.buckets[self.next_launch])
            self.next_launch += 1

    def _launch(self, bucket: _RingBucket) -> None:
        bucket.done.clear()
        bucket.filled = 0
        work = self.group.allreduce_async([bucket.flat], [bucket.priority], op="avg")
        threading.Thread(target=self._land, args=(bucket, work), daemon=True, name="gy-ring-bucket").start()

    def _land(self, bucket: _RingBucket, work) -> None:
        try:
            work.wait()
            for tensor in bucket.tensors:
                self.params[tensor].add_(bucket.views[tensor].view_as(self.params[tensor]), alpha=-LEARNING_RATE)
        except BaseException as exc:  # noqa: BLE001 -- raised where these parameters are waited for
            bucket.error = exc
        finally:
            bucket.done.set()

    def _wait(self, bucket: _RingBucket) -> None:
        if not bucket.done.wait(self.args.timeout):
            raise TransportError(f"a bucket's allreduce did not land in {self.args.timeout:g} s")
        if bucket.error is not None:
            raise TransportError(f"a bucket's allreduce failed: {bucket.error}") from bucket.error

    # -- forward: wait for the parameters it reads -----------------------------------------------
    def _before_forward(self, _index, name) -> None:
        tensor = self.tensor_of.get(name)
        if tensor is None or self.offline or self.group is None:
            return
        entered = time.perf_counter()
        for bucket in ([self.bucket_of[tensor]] if self.overlap == "next-forward" else self.buckets):
            self._wait(bucket)
        left = time.perf_counter()
        self.blocked_s += left - entered
        if self.timeline is not None and left - entered > 1e-4:
            self.timeline.span(f"wait {name}", "wait", _wall(entered), _wall(left), args={"tensor": tensor})

    def iteration_done(self) -> None:
        """Backward has ended: every bucket must have started (the next backward fills them again)."""
        if self.next_launch != len(self.buckets):
            raise TransportError(f"backward filled {self.next_launch} of {len(self.buckets)} buckets")
        self.next_launch = 0

    def drain(self) -> dict:
        try:
            for bucket in self.buckets:
                self._wait(bucket)
        finally:
            self.group.close()
            self.group = None
        trace = _save_timeline(self.timeline)
        self.timeline = None
        return {"applied": applied_updates(self.params), "digest": params_digest(self.params),
                "threads": threading.active_count(), "trace": trace}
