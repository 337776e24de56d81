"""The parameter-server worker: pushes gradient shards, pulls parameters into the model's tensors.

The protocol it speaks with the servers is described in geryon.transport.ps_protocol.

Parameters on a GPU (and CPU ones when the worker is made with `stage_host=True`, which runs the
same pipeline on host buffers) cross through geryon.transport.staging, as the allreduce's buckets
do: a pushed shard is a `StagedSlice` that the flow's sender copies from the device into one of its
host slots on a side stream when its turn comes (once the compute stream has made the gradient:
`push_tensor`'s marker), while the slice before it is on the wire; a pulled shard lands in a host
slot of its flow and is copied into the parameter on the flow's side stream, after the work the
compute stream had queued when the pull was asked for. `wait_param` then makes the caller's stream
wait for those copies' events: the forward's per-layer waits never synchronise the device.
"""

from __future__ import annotations

import json
import time

import torch

from geryon.errors import ConfigError, ProtocolError, TransportError
from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool, PoolOwner, next_sequence
from geryon.transport.ps_protocol import shard_layout
from geryon.transport.shards import Shard, bytes_per_server
from geryon.transport.staging import HostStaging, Marker, StagedSlice, flow_outbox, mark, staging_for
from geryon.transport.wire import Kind, byte_view, dtype_code, encode_control, encode_header, slice_view


class PSWorker(PoolOwner):
    """Worker `rank` of `workers`: pushes gradients to and pulls parameters from the servers.

    `params` are the model's parameter tensors (contiguous; on the CPU or a CUDA device), in the
    same order as the servers'; pulled values are written into them in place. Tensors not on the
    CPU are staged (module docstring); `stage_host=True` stages CPU tensors the same way.
    """

    def __init__(self, rank: int, workers: int, servers, params, config: TransportConfig,
                 priorities=None, stage_host: bool = False):
        self.rank, self.config = rank, config
        self.policy = config.scheduling
        self.params = [p.data if isinstance(p, torch.nn.Parameter) else p for p in params]
        for p in self.params:
            if not p.is_contiguous():
                raise ConfigError("PSWorker needs contiguous parameter tensors")
        self.staged = [stage_host or p.device.type != "cpu" for p in self.params]
        self._outboxes: dict[tuple, HostStaging] = {}   # (sending flow, device) -> its staging
        self._inboxes: dict[tuple, HostStaging] = {}    # (receiving flow, device) -> its staging
        self._landing: dict[object, Shard] = {}         # receiving flow -> the staged shard it reads
        self._pull_marks: dict[torch.device, Marker] = {}   # per device: the compute work before the pull
        self.ready: list[list[Marker]] = [[] for _ in self.params]   # per tensor: its shards' copies
        self.specs, self.plan, self.digest = shard_layout(self.params, priorities, config, len(servers), workers)
        self.bytes_per_server = bytes_per_server(self.specs, self.plan, len(servers))
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
        self._state_answers: dict[int, bytes] = {}
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

        For pushing during backward, as each gradient becomes ready (geryon.runtime.ps_sync): push
        every tensor once per iteration, then advance with `self.iteration += 1` and `pull()`.
        `grad` must stay unchanged until the servers have it (the next pull completes). A staged
        tensor's shards are copied out of `grad` once the work queued on the caller's stream so far
        (the work that made `grad`) is done.
        """
        spec = self.specs[tensor]
        grad = grad.detach()
        self._check_gradient(tensor, grad)
        grad = grad.contiguous()
        staged = self.staged[tensor]
        if staged:
            data, after = grad.reshape(-1), mark(grad.device)
        else:
            data = byte_view(grad)
        size, code = grad.element_size(), dtype_code(spec.dtype)
        for shard in self.shards_of[tensor]:
            header = encode_header(Kind.PUSH, job_id=self.config.job_id, iteration=self.iteration,
                                   tensor_id=shard.tensor_id, offset=shard.offset, length=shard.length,
                                   dtype=code, priority=shard.priority)
            key = self.policy.send_key(self.iteration, shard.priority, shard.urgency, next_sequence())
            flow = self.pool.flow(shard.server, self.policy.flow_of(shard.priority))
            if staged:
                payload = StagedSlice(self._outbox(flow, grad.device),
                                      data[shard.offset:shard.offset + shard.length], after)
            else:
                payload = data[shard.offset * size:(shard.offset + shard.length) * size]
            flow.send(key, header, payload)

    def _outbox(self, flow, device) -> HostStaging:
        """The staging `flow`'s sender copies `device` shards through (used by that thread only)."""
        return flow_outbox(self._outboxes, self.pool.cond, flow, device, self.config.max_slice_bytes)

    @property
    def staging_bytes(self) -> int:
        """Host bytes held by this worker's staging (SLOTS slots per flow, direction and device used)."""
        with self.pool.cond:
            stagings = [*self._outboxes.values(), *self._inboxes.values()]
        return sum(staging.slot_bytes for staging in stagings)

    def _inbox(self, flow, device) -> HostStaging:
        """The staging `flow`'s receive thread lands `device` shards in (used by that thread only)."""
        staging = self._inboxes.get((flow, device))
        if staging is None:
            staging = staging_for(device, self.config.max_slice_bytes)
            with self.pool.cond:
                self._inboxes[(flow, device)] = staging
        return staging

    def push_absent(self, tensor: int) -> None:
        """Tell the servers this worker has no gradient for `tensor` in iteration `self.iteration`.

        An ABSENT frame per shard instead of a zero push: the server counts it as a zero gradient
        and, when every worker said so, leaves the tensor as torch.optim leaves a parameter without
        .grad. Used with --ps-pull ahead, where the STEP frame leaves before presence is known.
        """
        for shard in self.shards_of[tensor]:
            frame = encode_control(Kind.ABSENT, shard.offset.to_bytes(8, "big"), job_id=self.config.job_id,
                                   iteration=self.iteration, tensor_id=shard.tensor_id)
            self.pool.flow(shard.server, 0).send((-1, next_sequence()), frame)

    def pull(self, iteration: int | None = None) -> None:
        """Ask every server for version `iteration` (default: the current one) of its shards."""
        iteration = self.iteration if iteration is None else iteration
        # a pulled value replaces a parameter only after the compute work queued so far (its reads)
        marks = {device: mark(device) for device in {p.device for p, staged in zip(self.params, self.staged)
                                                      if staged}}
        with self.pool.cond:
            self.pull_iteration = iteration
            self._pull_marks = marks
            for key in self.pulled:
                self.pulled[key] = -1
            for tid, shards in enumerate(self.shards_of):
                self.missing[tid] = len(shards)
                self.ready[tid] = []
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

    def send_step(self, vector: torch.Tensor) -> None:
        """Send this iteration's STEP frame (float64 settings; see the module docstring) to every server.

        Call it once per iteration, after the last push_tensor and before advancing the iteration;
        `vector` must stay unchanged until sent.
        """
        vector = vector.detach().to(torch.float64).contiguous()
        header = encode_header(Kind.STEP, job_id=self.config.job_id, iteration=self.iteration,
                               tensor_id=len(self.specs), length=vector.numel(),
                               dtype=dtype_code(torch.float64))
        data = byte_view(vector)
        for server in self.servers:
            self.pool.flow(server, 0).send((-1, next_sequence()), header, data)

    def state_request(self, op: str, key: str) -> None:
        """Ask every server to save ("save") or load ("load") optimizer state under store `key`.

        Returns once every server answered; raises ConfigError with the first server's error.
        Only between iterations (after wait_all), while no other worker pushes.
        """
        frame = encode_control(Kind.STATE, json.dumps({"op": op, "key": key}).encode(),
                               job_id=self.config.job_id)
        with self.pool.cond:
            self._state_answers.clear()
        started = time.monotonic()
        for server in self.servers:
            self.pool.flow(server, 0).send((-1, next_sequence()), frame)
        self.pool.wait_until(lambda: len(self._state_answers) == len(self.servers),
                             f"optimizer state {op}", self.servers, progress=lambda: started)
        errors = [answer.decode(errors="replace") for _, answer in sorted(self._state_answers.items())
                  if answer != b"ok"]
        if errors:
            raise ConfigError(f"optimizer state {op} failed: {errors[0]}")

    def wait_param(self, tensor: int) -> torch.Tensor:
        """Block until parameter `tensor` (index) holds the pulled version; return it.

        A staged tensor on a GPU: block until its shards have landed, then make the caller's
        current stream wait for their copies to the device (the device is not synchronised). Every
        caller waits for them (a reader on another thread or stream too) until the next pull.
        """
        self.pool.wait_until(lambda: self.missing[tensor] == 0,
                             f"parameter {tensor} of iteration {self.pull_iteration}",
                             sorted({s.server for s in self.shards_of[tensor]}),
                             progress=lambda: self.last_progress)
        if self.staged[tensor]:
            with self.pool.cond:
                markers = list(self.ready[tensor])
            param = self.params[tensor]
            for marker in markers:
                if marker is not None:
                    torch.cuda.current_stream(param.device).wait_event(marker)
        return self.params[tensor]

    def wait_all(self) -> None:
        for tensor in range(len(self.params)):
            self.wait_param(tensor)

    def flow_failed(self, flow, exc: TransportError) -> None:
        """A server's connection broke: tell the other servers, which tell their workers."""
        self.abort_others(flow, exc, f"worker {self.rank} lost its connection: {exc}")

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
        param = self.params[shard.tensor_id]
        if self.staged[shard.tensor_id]:
            self._landing[flow] = shard
            return self._inbox(flow, param.device).landing(header.payload_len)
        return slice_view(param, shard.offset, shard.length)

    def delivered(self, flow, header) -> None:
        shard = self._shard_for(flow, header)
        ready = None
        if self.staged[shard.tensor_id]:
            if self._landing.pop(flow, None) is not shard:
                raise ProtocolError(f"{header.describe()} from {flow.name} was not the frame it announced")
            param = self.params[shard.tensor_id]
            with self.pool.cond:
                after = self._pull_marks.get(param.device)
            ready = self._inbox(flow, param.device).into(
                param.reshape(-1)[shard.offset:shard.offset + shard.length], add=False, after=after)
        with self.pool.cond:
            if ready is not None:
                self.ready[shard.tensor_id].append(ready)
            self.pulled[shard.key] = header.iteration
            self.missing[shard.tensor_id] -= 1
            self.last_progress = time.monotonic()
            self.pool.cond.notify_all()

    def control(self, flow, header, payload: bytes) -> None:
        if header.kind == Kind.STATE:
            with self.pool.cond:
                self._state_answers[flow.peer_id] = payload
                self.pool.cond.notify_all()
            return
        if header.kind != Kind.PLAN:
            raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
        with self.pool.cond:
            self._server_digests[flow.peer_id] = payload
            self.pool.cond.notify_all()
