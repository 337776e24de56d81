"""Partial allreduce (Ripples' P-Reduce) inside a worker: small groups average their models.

With `--sync partial` or `--sync partial-static` (allreduce mode), a worker trains on its own: the
user's optimizer steps on the worker's own gradients, then (an optimizer step post-hook) the worker
averages its model (parameters and floating-point buffers, as one flat tensor) with the members of
one group of about P workers (`--sync partial:P`, default geryon.syncmodes.DEFAULT_GROUP_SIZE), over geryon's flows
(geryon.transport.group_reduce: the classes and DSCP of allreduce mode; the first half of the
model's elements, the layers the next forward needs first, in class 0, the rest in class 1).
This is Ripples' order: models are averaged after local steps, not gradients before them.

Which group a worker joins comes from a group generator; a worker asks for its next group only
when its last group reduce has ended, so it is in at most one active group at a time (the paper's
atomicity: groups that share a worker never run at once on it).
  - `StaticSchedule` (partial-static): a deterministic schedule every worker computes alike; the
    k-th reduce of every worker belongs to one partition of the workers into groups, rotated by
    half a group each round so that information spreads. Right when workers run at the same pace.
  - `ReadyGenerator` (partial): Ripples' smart generator, a small service on rank 0 reached through
    the job's store. A worker posts that it is ready; the service forms a group from the first P
    workers ready, or from all the ready ones once every worker still training is waiting, so a
    slow worker never holds the fast ones back, and it joins whichever workers are ready next.
When training ends (`finish()`, called by geryon.average_replicas(model) and at exit) a worker
leaves the generator and every worker averages its model with all the others once, so every
replica ends equal.

Every worker must call `finish()` (or exit) for the final average; a worker that dies is reported by
the transport's error naming it, within the transport timeout, as in allreduce mode.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

import torch

from geryon.errors import ConfigError
from geryon.runtime import jobtransport
from geryon.syncmodes import SyncChoice

log = logging.getLogger(__name__)

FINAL_SEQ = 0xFFFFFFFF          # the group-reduce number of the final average among every worker
START_SEQ = FINAL_SEQ - 1       # ... and of the start, when every worker takes rank 0's model
POLL_S = 0.0005                 # how often the ready service looks for workers that became ready


def static_groups(round_: int, world: int, size: int) -> list[list[int]]:
    """Round `round_` of the static schedule: a partition of range(world) into groups of `size`
    (a last group shorter than 2 joins the one before), rotated by size // 2 per round."""
    size = min(size, world)
    shift = (round_ * max(1, size // 2)) % world
    order = [(shift + i) % world for i in range(world)]
    groups = [order[i:i + size] for i in range(0, world, size)]
    if len(groups) > 1 and len(groups[-1]) < 2:
        groups[-2].extend(groups.pop())
    return [sorted(g) for g in groups]


class StaticSchedule:
    """partial-static: the k-th group of a worker is its group in round k of `static_groups`."""

    def __init__(self, rank: int, world: int, size: int):
        self.rank, self.world, self.size = rank, world, size
        self.round = 0

    def next_group(self) -> tuple[int, list[int]]:
        groups = static_groups(self.round, self.world, self.size)
        index = next(i for i, g in enumerate(groups) if self.rank in g)
        seq = self.round * self.world + index
        self.round += 1
        return seq, groups[index]

    def leave(self) -> None:
        return None


class ReadyGenerator:
    """partial: groups from the workers ready first; the service runs on rank 0 (`serve`).

    Keys under `{prefix}partial/`: `ready/{rank}/{k}` (a worker's k-th request; value "ready" or
    "leave") and `group/{rank}/{k}` (the service's answer: "seq:m1,m2,...").
    """

    def __init__(self, open_store, prefix: str, rank: int, world: int, size: int):
        self.prefix, self.rank, self.world, self.size = f"{prefix}partial/", rank, world, size
        self.store = open_store()
        self.k = 0
        if rank == 0:   # a client of its own: a store client serves one blocking call at a time
            threading.Thread(target=self.serve, args=(open_store(),), name="gy-partial-groups",
                             daemon=True).start()

    def next_group(self) -> tuple[int, list[int]]:
        self.store.set(f"{self.prefix}ready/{self.rank}/{self.k}", "ready")
        answer = self.store.get(f"{self.prefix}group/{self.rank}/{self.k}").decode()
        self.k += 1
        seq, _, members = answer.partition(":")
        return int(seq), [int(m) for m in members.split(",")]

    def leave(self) -> None:
        self.store.set(f"{self.prefix}ready/{self.rank}/{self.k}", "leave")
        self.k += 1

    def serve(self, store) -> None:
        """Form groups until every worker has left (rank 0's thread, with its own store client)."""
        asked = [0] * self.world         # requests read so far, per worker
        live, ready = set(range(self.world)), []
        seq = 0
        try:
            while live:
                for rank in sorted(live - set(ready)):
                    key = f"{self.prefix}ready/{rank}/{asked[rank]}"
                    if not store.check([key]):
                        continue
                    asked[rank] += 1
                    if store.get(key) == b"leave":
                        live.discard(rank)
                    else:
                        ready.append(rank)
                while ready and (len(ready) >= self.size or len(ready) == len(live)):
                    group, ready = sorted(ready[:self.size]), ready[self.size:]
                    for member in group:
                        store.set(f"{self.prefix}group/{member}/{asked[member] - 1}",
                                       f"{seq}:{','.join(map(str, group))}")
                    seq = (seq + 1) % START_SEQ
                time.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001 - the store went away: the job is ending or failed
            log.info("geryon: partial allreduce's group service stopped: %s", exc)


def model_tensors(model) -> list[torch.Tensor]:
    """What a group averages: the parameters, then the floating-point buffers, in module order."""
    tensors = [p for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    if any(t.device.type != "cpu" for t in tensors):
        raise ConfigError("--sync partial averages models held on the CPU (its mesh sends from host memory); "
                          "keep the model on the CPU, or use --sync full on GPUs")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise ConfigError(f"--sync partial averages the model as one flat tensor, but it holds "
                          f"{sorted(map(str, dtypes))}: keep parameters and buffers in one dtype "
                          "(e.g. model.float()), or use --sync full")
    return tensors


def class_bounds(tensors, classes: int) -> list[int]:
    """Where each class's elements start, plus the end: the leading tensors that fit in the first
    half of the elements (at least the first tensor) in class 0, the rest in class 1, no element in
    the classes after it (a single class: [0, numel])."""
    total = sum(t.numel() for t in tensors)
    if classes < 2 or not tensors:
        return [0, total]
    first = tensors[0].numel()
    for tensor in tensors[1:]:
        if (first + tensor.numel()) * 2 > total:
            break
        first += tensor.numel()
    return [0, first] + [total] * (classes - 1)


class PartialAllreduceSync:
    """Hooks a worker's optimizer so that each step is followed by a group average of its model."""

    def __init__(self, model, optimizer, job, choice: SyncChoice, timeline=None):
        self.model, self.optimizer, self.job, self.choice = model, optimizer, job, choice
        self.timeline = timeline
        self.tensors = model_tensors(model)
        self.flat = torch.cat([t.detach().reshape(-1) for t in self.tensors]) if self.tensors else None
        self.groups: list[tuple[int, list[int], float, float]] = []   # (seq, members, start, end)
        self.finished = False
        self._lock = threading.Lock()

    def attach(self):
        """Connect the mesh, start from rank 0's model, and hook the optimizer; returns self."""
        from geryon.transport.group_reduce import GroupReduce
        from geryon.transport.hooks import peers_from_store

        job = self.job
        tracer = self.timeline.transfer if self.timeline else None
        config = jobtransport.transport_config(job, tracer=tracer)
        self.store = jobtransport.open_store(job)
        host = jobtransport.listen_host(job)
        reservation = jobtransport.reserve_port(host)
        try:
            port = reservation.getsockname()[1]
            peers = peers_from_store(self.store, job.rank, job.world_size, host, port,
                                     prefix=f"{job.store_prefix}transport/partial")
            self.mesh = GroupReduce(job.rank, job.world_size, peers, config, self.flat.numel(),
                                    self.flat.dtype, listen=(host, port))
        finally:
            reservation.close()
        self.bounds = class_bounds(self.tensors, config.classes)
        size = min(self.choice.group_size, job.world_size)
        if self.choice.kind == "partial-static":
            self.generator = StaticSchedule(job.rank, job.world_size, size)
        else:
            self.generator = ReadyGenerator(lambda: jobtransport.open_store(job), job.store_prefix, job.rank,
                                            job.world_size, size)
        self._broadcast_from_rank0()
        self.optimizer.register_step_post_hook(lambda *_: self.average_with_group())
        atexit.register(self.close)
        if job.is_main:
            print(f"geryon: --sync {self.choice.text()}: after each step a worker averages its model "
                  f"with a group of {size} workers", flush=True)
        return self

    def _broadcast_from_rank0(self) -> None:
        """Every worker starts from rank 0's model: the sum of rank 0's model and everyone else's zeros."""
        self._gather()
        if self.job.rank != 0:
            self.flat.zero_()
        self.mesh.average(START_SEQ, range(self.job.world_size), self.flat, self.bounds, divide=False)
        self._scatter()

    def average_with_group(self) -> None:
        """One P-Reduce: ask the generator for a group, average the model with it."""
        with self._lock:
            if self.finished:
                return
            seq, members = self.generator.next_group()
            start = time.time()
            self._gather()
            self.mesh.average(seq, members, self.flat, self.bounds)
            self._scatter()
            end = time.time()
        self.groups.append((seq, members, start, end))
        if self.timeline is not None:
            self.timeline.group(seq, members, start, end)

    def finish(self) -> None:
        """Leave the generator and average with every worker, so every replica ends equal."""
        with self._lock:
            if self.finished:
                return
            self.finished = True
            self.generator.leave()
            start = time.time()
            self._gather()
            self.mesh.average(FINAL_SEQ, range(self.job.world_size), self.flat, self.bounds)
            self._scatter()
        if self.timeline is not None:
            self.timeline.group(FINAL_SEQ, list(range(self.job.world_size)), start, time.time())

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.mesh.close()

    def _gather(self) -> None:
        offset = 0
        with torch.no_grad():
            for tensor in self.tensors:
                n = tensor.numel()
                self.flat[offset:offset + n].copy_(tensor.detach().reshape(-1))
                offset += n

    def _scatter(self) -> None:
        offset = 0
        with torch.no_grad():
            for tensor in self.tensors:
                n = tensor.numel()
                tensor.detach().copy_(self.flat[offset:offset + n].view_as(tensor))
                offset += n


_active: PartialAllreduceSync | None = None


def attach_partial(model, optimizer, job, choice: SyncChoice, timeline=None) -> PartialAllreduceSync:
    """Start partial allreduce for this worker (geryon.distribute in allreduce mode with --sync partial)."""
    global _active
    if optimizer is None:
        raise ConfigError("--sync partial averages models after the optimizer's step: "
                          "use geryon.distribute(model, optimizer)")
    _active = PartialAllreduceSync(model, optimizer, job, choice, timeline).attach()
    return _active


def average_replicas() -> None:
    """End partial allreduce: every worker averages its model with all the others (no-op otherwise)."""
    if _active is not None:
        _active.finish()
