"""Parameter-server mode: M servers hold parameter shards; workers push gradients, pull parameters.

Iteration protocol (synchronous): a worker at iteration i pushes every gradient shard tagged i; a
server aggregates a shard once all W workers' pushes for i arrived -- the mean, summed in worker
order 0..W-1 -- and applies torch's SGD update (momentum, dampening, weight decay, nesterov: the
function `torch.optim.SGD.step` itself calls, with per-shard momentum state, so semantics match
exactly), making the shard's version i + 1. A worker's `pull(i + 1)` asks every server for
version i + 1 of its shards; each server answers as shards become ready, through its send queues
in urgency order on the class's flow.
Parameters land directly in the worker's tensors; `wait_param(t)` blocks until tensor t is
complete, so the next forward pass can start layer by layer.

Workers must not start pushing iteration i + 1 before their pull of i + 1 completed (the server
sends parameter slices from its live tensors without copying).
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from torch.optim.sgd import sgd as sgd_update

from geryon.errors import ConfigError, PeerAborted, ProtocolError, TransportError
from geryon.transport.buckets import normalize_priorities
from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool, PoolOwner, next_sequence
from geryon.transport.shards import Shard, param_specs, plan_shards, shard_digest
from geryon.transport.wire import (Kind, byte_view, dtype_code, encode_control, encode_header,
                                   slice_view)

log = logging.getLogger(__name__)

ABORT_GRACE = 5.0   # seconds a server waits for the other workers to leave after losing one


class _ServerShard:
    """A server's state for one shard: value, per-worker gradient buffers, optimizer state."""

    def __init__(self, shard: Shard, value: torch.Tensor, workers: int, sgd: dict):
        self.shard = shard
        self.param = value.detach().clone().reshape(-1)
        self.grads = [torch.empty_like(self.param) for _ in range(workers)]
        # the wire's views of them, made once (the tensors are only ever updated in place)
        self.param_bytes = byte_view(self.param)
        self.grad_bytes = [byte_view(grad) for grad in self.grads]
        self.dtype_code = dtype_code(self.param.dtype)
        self.sgd = sgd
        self.momentum_buffer: list[torch.Tensor | None] = [None]
        self.version = 0
        self.arrived: set[int] = set()
        self.waiting_pulls: set[int] = set()   # workers that asked for the next version
        self.lock = threading.Lock()

    def step(self, grad: torch.Tensor) -> None:
        """One torch.optim.SGD step: the very function SGD.step calls, without its per-call cost.

        (SGD.step's hooks, profiler ranges and grad-mode switches took ~0.5 ms per slice, a
        quarter of a slice's time on the wire at 1 Gbit/s.)
        """
        sgd_update([self.param], [grad], self.momentum_buffer, foreach=False, maximize=False,
                   **self.sgd)


class ParameterServer(PoolOwner):
    """Server `index` of `servers`: holds its shards of `params` and serves `workers` workers.

    `params`: the initial parameter tensors in model order (every rank passes the same list);
    `priorities`: per tensor a class or (class, urgency); the SGD keywords go to torch.optim.SGD.
    """

    def __init__(self, index: int, servers: int, workers: int, params, config: TransportConfig,
                 listen: tuple[str, int], priorities=None, *, lr: float = 0.01,
                 momentum: float = 0.0, weight_decay: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False):
        params = [p.detach() for p in params]
        self.index, self.workers, self.config = index, workers, config
        self.policy = config.scheduling
        prios = normalize_priorities(len(params), priorities, config.classes)
        self.specs = param_specs(params, prios)
        self.plan = plan_shards(self.specs, servers, self.policy, config.slice_bytes,
                                config.placement)
        self.digest = shard_digest(self.specs, self.plan, servers, workers)
        sgd = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening,
                   nesterov=nesterov)
        self.shards: dict[tuple[int, int], _ServerShard] = {}
        for shard in self.plan:
            if shard.server == index:
                flat = params[shard.tensor_id].reshape(-1)
                self.shards[shard.key] = _ServerShard(
                    shard, flat[shard.offset:shard.offset + shard.length], workers, sgd)
        self.failure: TransportError | None = None   # the first worker lost; the job is over
        self._failed_at = 0.0
        self.joined: set[int] = set()   # workers that sent the right plan digest (took part)
        self.pool = FlowPool(index, config, self, listen=listen, peer_label="worker",
                             accept_peers=set(range(workers)))

    @property
    def port(self) -> int:
        return self.pool.port

    def tensor_numel(self, tensor_id: int) -> int | None:
        return self.specs[tensor_id].numel if tensor_id < len(self.specs) else None

    def values(self) -> dict[tuple[int, int], torch.Tensor]:
        """Current value of each shard this server holds, keyed by (tensor_id, offset)."""
        return {key: s.param for key, s in self.shards.items()}

    def serve_until_workers_leave(self, timeout: float | None = None) -> None:
        """Block until every worker said goodbye or failed, or until `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.pool.cond:
            while len(self.pool.left | set(self.pool.failures)) < self.workers:
                if deadline is not None and time.monotonic() > deadline:
                    return
                self.pool.cond.wait(0.2)

    def serve_job(self, abort_grace: float = ABORT_GRACE) -> None:
        """Serve until every worker left; raise a TransportError naming the worker if one was lost.

        When a worker is lost (connection closed, reset or stalled mid-frame), the other workers
        were told at once (ABORT); this waits for them to leave, at most `abort_grace` seconds.
        """
        while True:
            self.serve_until_workers_leave(timeout=0.2)
            with self.pool.cond:
                everyone = len(self.pool.left | set(self.pool.failures)) >= self.workers
                failure, failed_at = self.failure, self._failed_at
            if failure is not None and (everyone or time.monotonic() > failed_at + abort_grace):
                raise failure
            if everyone:
                return

    def flow_failed(self, flow, exc: TransportError) -> None:
        """A worker's connection broke: tell every other worker, so none waits for the timeout.

        Malformed frames (ProtocolError) only cost the sender its connection, and so does any
        failure of a connection whose worker never joined (sent the plan digest): a stray or
        hostile client cannot end the job.
        """
        if isinstance(exc, ProtocolError) or flow.peer_id not in self.joined or flow.peer_done \
                or flow.peer_id in self.pool.left or self.pool.closed:
            return
        reason = exc.reason if isinstance(exc, PeerAborted) else f"worker {flow.peer_id} failed ({exc})"
        with self.pool.cond:
            if self.failure is not None:
                return
            self.failure = TransportError(f"server {self.index}: {reason}")
            self._failed_at = time.monotonic()
        self.pool.abort(f"server {self.index}: {reason}", skip_peer=flow.peer_id)

    # -- frames from workers ------------------------------------------------------------------
    def _shard_for(self, flow, header) -> _ServerShard:
        state = self.shards.get((header.tensor_id, header.offset))
        if state is None or state.shard.length != header.length \
                or header.dtype != self.specs[header.tensor_id].dtype:
            raise ProtocolError(f"{header.describe()} from {flow.name} is not a shard of server "
                                f"{self.index}")
        return state

    def destination(self, flow, header) -> memoryview:
        if header.kind != Kind.PUSH:
            raise ProtocolError(f"{header.kind.name} frame from {flow.name}; servers take PUSH only")
        state = self._shard_for(flow, header)
        worker = flow.peer_id
        with state.lock:
            if header.iteration != state.version:
                raise ProtocolError(f"{flow.name} pushed iteration {header.iteration} of tensor "
                                    f"{header.tensor_id}, the shard is at {state.version}")
            if worker in state.arrived:
                raise ProtocolError(f"{flow.name} pushed tensor {header.tensor_id} twice")
        return state.grad_bytes[worker]

    def delivered(self, flow, header) -> None:
        state = self._shard_for(flow, header)
        with state.lock:
            state.arrived.add(flow.peer_id)
            if len(state.arrived) < self.workers:
                return
            grad = state.grads[0].clone()
            for other in state.grads[1:]:
                grad.add_(other)
            grad.div_(self.workers)
            state.step(grad)
            state.version += 1
            state.arrived.clear()
            ready, state.waiting_pulls = state.waiting_pulls, set()
        for worker in sorted(ready):
            self._send_param(worker, state)

    def control(self, flow, header, payload: bytes) -> None:
        if header.kind == Kind.PLAN:
            flow.send((-1,), encode_control(Kind.PLAN, self.digest, job_id=self.config.job_id))
            if payload != self.digest:
                log.warning("%s has another shard plan than server %d", flow.name, self.index)
            else:
                with self.pool.cond:
                    self.joined.add(flow.peer_id)
            return
        if header.kind != Kind.PULL:
            raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
        worker, iteration = flow.peer_id, header.iteration
        for state in self.shards.values():
            with state.lock:
                if state.version < iteration:
                    state.waiting_pulls.add(worker)
                    continue
            self._send_param(worker, state)

    def _send_param(self, worker: int, state: _ServerShard) -> None:
        shard = state.shard
        header = encode_header(Kind.PARAM, job_id=self.config.job_id, iteration=state.version,
                               tensor_id=shard.tensor_id, offset=shard.offset, length=shard.length,
                               dtype=state.dtype_code, priority=shard.priority)
        key = self.policy.send_key(state.version, shard.priority, shard.urgency, next_sequence())
        flow = self.pool.flow(worker, self.policy.flow_of(shard.priority))
        flow.send(key, header, state.param_bytes)


class PSWorker(PoolOwner):
    """Worker `rank` of `workers`: pushes gradients to and pulls parameters from the servers.

    `params` are the model's parameter tensors (contiguous, CPU), in the same order as the
    servers'; pulled values are written into them in place.
    """

    def __init__(self, rank: int, workers: int, servers, params, config: TransportConfig,
                 priorities=None):
        self.rank, self.config = rank, config
        self.policy = config.scheduling
        self.params = [p.data if isinstance(p, torch.nn.Parameter) else p for p in params]
        for p in self.params:
            if not p.is_contiguous():
                raise ConfigError("PSWorker needs contiguous parameter tensors")
        prios = normalize_priorities(len(self.params), priorities, config.classes)
        self.specs = param_specs(self.params, prios)
        self.plan = plan_shards(self.specs, len(servers), self.policy, config.slice_bytes,
                                config.placement)
        self.digest = shard_digest(self.specs, self.plan, len(servers), workers)
        self.by_key = {s.key: s for s in self.plan}
        self.shards_of = [[] for _ in self.params]
        for shard in self.plan:
            self.shards_of[shard.tensor_id].append(shard)
        self.servers = list(range(len(servers)))
        self.iteration = 0
        self.pulled: dict[tuple[int, int], int] = {s.key: -1 for s in self.plan}  # -1: local init
        self.missing = [0] * len(self.params)     # shards of each tensor still to arrive
        self.pull_iteration = 0
        self.last_progress = time.monotonic()
        self._server_digests: dict[int, bytes] = {}
        self._aborted = False
        self.pool = FlowPool(rank, config, self, listen=None, peer_label="server")
        for index, address in enumerate(servers):
            self.pool.connect(index, tuple(address))
            self.pool.flow(index, 0).send((-1,), encode_control(Kind.PLAN, self.digest,
                                                                job_id=config.job_id))
        start = time.monotonic()
        self.pool.wait_until(lambda: len(self._server_digests) == len(servers),
                             "shard-plan digests", self.servers, progress=lambda: start)
        wrong = sorted(s for s, d in self._server_digests.items() if d != self.digest)
        if wrong:
            self.pool.close()
            raise ProtocolError(f"servers {wrong} have another parameter shard plan than worker "
                                f"{rank}: every rank must pass the same parameters, priorities, "
                                "policy and counts of servers and workers")

    # -- the training step --------------------------------------------------------------------
    def push(self, grads) -> None:
        """Queue every gradient shard of iteration `self.iteration` (returns at once)."""
        grads = [g.detach() for g in grads]
        if len(grads) != len(self.params):
            raise ConfigError(f"{len(grads)} gradients for {len(self.params)} parameters")
        for tensor, grad in enumerate(grads):   # all checked before any is queued
            self._check_gradient(tensor, grad)
        for tensor, grad in enumerate(grads):
            self.push_tensor(tensor, grad)

    def _check_gradient(self, tensor: int, grad) -> None:
        spec = self.specs[tensor]
        if grad.numel() != spec.numel or grad.dtype != spec.dtype:
            raise ConfigError(f"gradient {tensor} is {grad.numel()} x {grad.dtype}, "
                              f"expected {spec.numel} x {spec.dtype}")

    def push_tensor(self, tensor: int, grad) -> None:
        """Queue the gradient shards of one tensor for iteration `self.iteration` (returns at once).

        For pushing during backward, as each gradient becomes ready (geryon.launch.ps_sync): push
        every tensor once per iteration, then advance with `self.iteration += 1` and `pull()`.
        `grad` must stay unchanged until the servers have it (the next pull completes).
        """
        spec = self.specs[tensor]
        grad = grad.detach()
        self._check_gradient(tensor, grad)
        grad = grad.contiguous()
        data, size, code = byte_view(grad), grad.element_size(), dtype_code(spec.dtype)
        for shard in self.shards_of[tensor]:
            header = encode_header(Kind.PUSH, job_id=self.config.job_id, iteration=self.iteration,
                                   tensor_id=shard.tensor_id, offset=shard.offset, length=shard.length,
                                   dtype=code, priority=shard.priority)
            key = self.policy.send_key(self.iteration, shard.priority, shard.urgency, next_sequence())
            flow = self.pool.flow(shard.server, self.policy.flow_of(shard.priority))
            flow.send(key, header, data[shard.offset * size:(shard.offset + shard.length) * size])

    def pull(self, iteration: int | None = None) -> None:
        """Ask every server for version `iteration` (default: the current one) of its shards."""
        iteration = self.iteration if iteration is None else iteration
        with self.pool.cond:
            self.pull_iteration = iteration
            for key in self.pulled:
                self.pulled[key] = -1
            for tid, shards in enumerate(self.shards_of):
                self.missing[tid] = len(shards)
            self.last_progress = time.monotonic()
        frame = encode_control(Kind.PULL, b"", job_id=self.config.job_id, iteration=iteration)
        for server in self.servers:
            # ahead of queued pushes: the server answers each shard as soon as it is updated
            self.pool.flow(server, 0).send((-1, next_sequence()), frame)

    def step(self, grads) -> None:
        """Push this iteration's gradients and pull the next iteration's parameters."""
        self.push(grads)
        self.iteration += 1
        self.pull(self.iteration)

    def wait_param(self, tensor: int) -> torch.Tensor:
        """Block until parameter `tensor` (index) holds the pulled version; return it."""
        self.pool.wait_until(lambda: self.missing[tensor] == 0,
                             f"parameter {tensor} of iteration {self.pull_iteration}",
                             sorted({s.server for s in self.shards_of[tensor]}),
                             progress=lambda: self.last_progress)
        return self.params[tensor]

    def wait_all(self) -> None:
        for tensor in range(len(self.params)):
            self.wait_param(tensor)

    def flow_failed(self, flow, exc: TransportError) -> None:
        """A server's connection broke: tell the other servers, which tell their workers."""
        if isinstance(exc, ProtocolError) or self._aborted or flow.peer_done or self.pool.closed:
            return
        self._aborted = True
        reason = (exc.reason if isinstance(exc, PeerAborted)
                  else f"worker {self.rank} lost its connection: {exc}")
        self.pool.abort(reason, skip_peer=flow.peer_id)

    # -- frames from servers ------------------------------------------------------------------
    def tensor_numel(self, tensor_id: int) -> int | None:
        return self.specs[tensor_id].numel if tensor_id < len(self.specs) else None

    def _shard_for(self, flow, header) -> Shard:
        shard = self.by_key.get((header.tensor_id, header.offset))
        if header.kind != Kind.PARAM or shard is None or shard.server != flow.peer_id \
                or shard.length != header.length or header.dtype != self.specs[shard.tensor_id].dtype:
            raise ProtocolError(f"{header.describe()} from {flow.name} is not a shard it serves")
        return shard

    def destination(self, flow, header) -> memoryview:
        shard = self._shard_for(flow, header)
        with self.pool.cond:
            if header.iteration != self.pull_iteration or self.pulled[shard.key] == header.iteration:
                raise ProtocolError(f"{flow.name} sent {header.describe()} unasked "
                                    f"(pulling iteration {self.pull_iteration})")
        return slice_view(self.params[shard.tensor_id], shard.offset, shard.length)

    def delivered(self, flow, header) -> None:
        shard = self._shard_for(flow, header)
        with self.pool.cond:
            self.pulled[shard.key] = header.iteration
            self.missing[shard.tensor_id] -= 1
            self.last_progress = time.monotonic()
            self.pool.cond.notify_all()

    def control(self, flow, header, payload: bytes) -> None:
        if header.kind != Kind.PLAN:
            raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
        with self.pool.cond:
            self._server_digests[flow.peer_id] = payload
            self.pool.cond.notify_all()
