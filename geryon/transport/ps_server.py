"""The parameter server: holds its shards, averages the workers' pushes, runs the optimizer, answers pulls.

The protocol it speaks with the workers is described in geryon.transport.ps_protocol.

When is a worker gone? A worker sends its PLAN, PULL and STEP frames on its control flow (flow 0,
CONTROL_FLOW), which it dials first. The worker is gone when that connection ends: it said BYE there
(left), or it closed, broke, stalled mid-frame or sent a malformed frame there (lost). Any other
connection under a worker's id is that connection only: a malformed frame, a stall or a close there
cuts it, the worker goes on training, and a PARAM the server cannot send on it is skipped (the worker,
waiting for it, fails on its own timeout). So an authenticated peer that opens a spare connection
under a joined worker's id cannot end the job by misbehaving on it.

Where a shard lives: on the CPU by default (the usual deployment: servers on CPU hosts). Made with
`device="cuda"` (`--server-device cuda`), a server holds each shard's value and optimizer state on
that GPU and runs the optimizer step there; the workers' pushes still land in host buffers (sockets
read host memory) and their mean is made on the CPU in the gradients' dtype (the same bits a GPU's
add and divide make), then copied to the GPU for the step, and the updated value is copied back to a
host mirror that pulls are answered from. Checkpoints and class switches read CPU copies
(`ServerShard.value`, `ServerShard.state`), so their files load on any machine.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field

import torch

from geryon.errors import ConfigError, PeerAborted, ProtocolError, TransportError
from geryon.transport import elementwise
from geryon.transport.config import TransportConfig
from geryon.transport.flows import FlowPool, PoolOwner, next_sequence
from geryon.transport.ps_protocol import shard_layout
from geryon.transport.server_optimizer import (SCALAR_STATE, STEP_HEADER, OptimizerSpec, apply_hyper,
                                               group_offsets, shard_state)
from geryon.transport.shards import Shard
from geryon.transport.wire import Kind, byte_view, dtype_code, encode_control, encode_header

log = logging.getLogger(__name__)

ABORT_GRACE = 5.0   # seconds a server waits for the other workers to leave after losing one
CONTROL_FLOW = 0    # a worker's flow for control frames, whose end is the worker's (module docstring)


class ServerShard:
    """A server's state for one shard: value, per-worker gradient buffers, its optimizer."""

    def __init__(self, shard: Shard, value: torch.Tensor, workers: int, spec: OptimizerSpec,
                 group: int, device: torch.device | str = "cpu"):
        self.shard = shard
        self.device = torch.device(device)
        self.host = value.detach().to("cpu", copy=True).reshape(-1)   # what pulls are answered from
        # on the CPU the host tensor is the value itself; on a GPU the value lives there
        self.param = self.host if self.device.type == "cpu" else self.host.to(self.device)
        self.grads = [torch.empty_like(self.host) for _ in range(workers)]
        self.device_grad = None if self.device.type == "cpu" else torch.empty_like(self.param)
        # the wire's views of them, made once (the tensors are only ever updated in place)
        self.param_bytes = byte_view(self.host)
        self.grad_bytes = [byte_view(grad) for grad in self.grads]
        self.dtype_code = dtype_code(self.param.dtype)
        self.group = group
        self.optimizer = None if spec.mean_only or group < 0 else spec.build(group, self.param)
        # the class's own step without Optimizer's per-call profiler range and hook loop (no hooks
        # are registered on a server's optimizers; that wrapper cost ~0.5 ms per slice)
        step = type(self.optimizer).step if self.optimizer is not None else None
        self._step = getattr(step, "__wrapped__", None) if getattr(step, "hooked", False) else None
        self.mean: torch.Tensor | None = None   # the mean gradient, made at the first update
        self.version = 0
        self.arrived: set[int] = set()
        self.absent: set[int] = set()     # workers that said ABSENT for `version` (no gradient)
        self.taken = False            # an update of `version` is under way
        self.waiting_pulls: dict[int, int] = {}   # worker -> the version it asked for (not yet made)
        self.lock = threading.Lock()

    @property
    def complete(self) -> bool:
        return len(self.arrived) == len(self.grads)

    def present(self, plan: "StepPlan") -> bool:
        """Some worker had a gradient for this shard's tensor (STEP presence and ABSENT frames)."""
        return plan.present(self.shard.tensor_id) and len(self.absent) < len(self.grads)

    def mean_gradient(self) -> torch.Tensor:
        """((g_0 + g_1) + ...) / workers, on this thread (geryon.transport.elementwise), into one
        buffer made at the shard's first update and reused, as the per-worker buffers are: an update
        is done with it before the shard's next version can arrive.

        A fresh tensor per update was new memory for a shard over glibc's 32 MiB mmap threshold (a
        whole tensor under an unsliced policy, e.g. `vanilla`): 16,385 page faults, and the mean of
        8 workers' 64 MiB took 53 ms instead of 31 (docs/transport.md).
        Sliced policies' 256 KiB shards were reused by the allocator anyway.
        """
        if self.mean is None:
            self.mean = torch.empty_like(self.grads[0])
        return elementwise.mean_(self.mean, self.grads)

    def update(self, grad: torch.Tensor, plan: "StepPlan", spec: OptimizerSpec, offsets) -> None:
        """Apply one iteration: the mean gradient (MEAN), or one step of the user's optimizer."""
        if spec.mean_only:
            elementwise.copy_(self.host, grad)
            if self.param is not self.host:
                self.param.copy_(self.host)
            return
        if self.optimizer is None or not self.present(plan):
            return   # in no group, or no worker had a gradient: torch.optim leaves it as it is
        if plan.scale is not None:
            grad.mul_(plan.scale)
        if plan.hyper is not None:
            apply_hyper(self.optimizer, spec.groups[self.group], plan.hyper, offsets[self.group])
        if self.device_grad is not None:
            grad = self.device_grad.copy_(grad)
        self.param.grad = grad
        try:
            if self._step is not None:
                self._step(self.optimizer)
            else:
                self.optimizer.step()
        finally:
            self.param.grad = None
        if self.param is not self.host:
            self.host.copy_(self.param)   # waits for the step: pulls send the host mirror

    def value(self) -> torch.Tensor:
        """A CPU copy of the shard's current value (for checkpoints and class switches)."""
        return self.host.clone()

    def load_value(self, value: torch.Tensor) -> None:
        """Set the shard's value (idle shards only)."""
        self.host.copy_(value)
        if self.param is not self.host:
            self.param.copy_(self.host)

    def state(self) -> dict:
        """The shard's optimizer state, its tensors on the CPU (as they are on a CPU server)."""
        if self.optimizer is None:
            return {}
        return {key: value.cpu() if torch.is_tensor(value) else value
                for key, value in self.optimizer.state.get(self.param, {}).items()}

    def load_state(self, state: dict) -> None:
        """Replace the shard's optimizer state by `state` (a shard's part; empty: none)."""
        self.optimizer.state.pop(self.param, None)
        if state:
            self.optimizer.state[self.param] = {key: self._placed(key, value) for key, value in state.items()}

    def _placed(self, key: str, value):
        """A state value where torch.optim keeps it (its load_state_dict's rule): tensors on the
        shard's device, except scalars such as `step`, which stay on the CPU unless the optimizer
        is capturable or fused."""
        if not torch.is_tensor(value):
            return value
        group = self.optimizer.param_groups[0]
        if key in SCALAR_STATE and not (group.get("capturable") or group.get("fused")):
            return value
        return value.to(self.device)


@dataclass
class StepPlan:
    """What every worker said about one iteration: settings, clipping, tensors with gradients."""

    hyper: list | None = None                 # numeric hyper-parameters (None: the spec's)
    clip: tuple | None = None                 # (max_norm, norm_type)
    presence: list | None = None              # per tensor: some worker had a gradient (None: all)
    scale: float | None = None                # the clipping factor, once computed
    done: int = 0                             # shards updated
    taken: set = field(default_factory=set)

    def present(self, tensor: int) -> bool:
        return self.presence is None or self.presence[tensor]


def combine_norm(partials, norm_type: float) -> float:
    if math.isinf(norm_type):
        return max(partials) if partials else 0.0
    return sum(partials) ** (1.0 / norm_type)


class ParameterServer(PoolOwner):
    """Server `index` of `servers`: holds its shards of `params` and serves `workers` workers.

    `params`: the initial parameter tensors in model order (every rank passes the same list);
    `priorities`: per tensor a class or (class, urgency); `optimizer`: the OptimizerSpec to run
    (default: torch.optim.SGD with the SGD keywords, every tensor in one group).
    `step_frames`: wait for every worker's STEP frame of an iteration before applying it.
    `norm_exchange(iteration, partial) -> [partial of server 0, 1, ...]`: how servers share their
    part of the gradient norm when a worker asks for clipping (one server: not needed).
    `state_exchange(server, op, key)`: runs a worker's STATE request ("save" or "load" under `key`,
    or "checkpoint" of step `key`). `device`: where the shards' values and optimizer state live
    and the optimizer steps (module docstring).
    """

    def __init__(self, index: int, servers: int, workers: int, params, config: TransportConfig,
                 listen: tuple[str, int], priorities=None, *, optimizer: OptimizerSpec | None = None,
                 step_frames: bool = False, norm_exchange=None, state_exchange=None,
                 device: torch.device | str = "cpu", lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False):
        params = [p.detach() for p in params]
        self.index, self.servers, self.workers, self.config = index, servers, workers, config
        self.policy = config.scheduling
        self.specs, self.plan, self.digest = shard_layout(params, priorities, config, servers, workers)
        self.shapes = [p.shape for p in params]
        if optimizer is None:
            optimizer = OptimizerSpec("SGD", ({"lr": lr, "momentum": momentum, "dampening": dampening,
                                                "weight_decay": weight_decay, "nesterov": nesterov},),
                                      (0,) * len(params))
        elif not optimizer.mean_only and len(optimizer.tensor_group) != len(params):
            raise ConfigError(f"the optimizer spec covers {len(optimizer.tensor_group)} tensors, "
                              f"not {len(params)}")
        self.optimizer = optimizer
        self.offsets = group_offsets(optimizer)
        self.step_frames = step_frames and not optimizer.mean_only
        self.step_length = STEP_HEADER + optimizer.hyper_length() + len(params)
        self.norm_exchange = norm_exchange
        self.state_exchange = state_exchange
        self.steps: dict[int, dict[int, torch.Tensor]] = {}   # iteration -> worker -> STEP vector
        self.step_buffers: dict[tuple[int, int], torch.Tensor] = {}   # (iteration, worker) arriving
        self.step_plans: dict[int, StepPlan] = {}
        self.step_lock = threading.Lock()
        self.shards: dict[tuple[int, int], ServerShard] = {}
        for shard in self.plan:
            if shard.server == index:
                flat = params[shard.tensor_id].reshape(-1)
                group = -1 if optimizer.mean_only else optimizer.tensor_group[shard.tensor_id]
                self.shards[shard.key] = ServerShard(
                    shard, flat[shard.offset:shard.offset + shard.length], workers, optimizer, group, device)
        self.failure: TransportError | None = None   # the first worker lost; the job is over
        self._failed_at = 0.0
        self.joined: set[int] = set()   # workers that sent the right plan digest (took part)
        self.pool = FlowPool(index, config, self, listen=listen, peer_label="worker",
                             accept_peers=set(range(workers)), peer_flow=CONTROL_FLOW)

    @property
    def port(self) -> int:
        return self.pool.port

    def tensor_numel(self, tensor_id: int) -> int | None:
        if tensor_id == len(self.specs) and self.step_frames:
            return self.step_length   # the STEP frame's pseudo tensor
        return self.specs[tensor_id].numel if tensor_id < len(self.specs) else None

    def shard_states(self) -> dict[tuple[int, int], dict]:
        """Optimizer state of each shard this server holds, keyed by (tensor_id, offset)."""
        return {key: s.state() for key, s in self.shards.items()}

    def load_shards(self, values=None, states=None) -> None:
        """Set shard values from whole tensors `values` and optimizer state from `states`.

        `states`: per tensor its whole optimizer state (a dict, as torch.optim holds it) or None.
        Only between iterations: every shard must be idle (no update under way).
        """
        for (tensor, offset), state in self.shards.items():
            with state.lock:
                length = state.shard.length
                if values is not None:
                    state.load_value(values[tensor].detach().reshape(-1)[offset:offset + length])
                if states is not None and state.optimizer is not None:
                    whole = states[tensor] or {}
                    state.load_state(shard_state(whole, torch.empty(self.shapes[tensor]), offset, length)
                                     if whole else {})

    def set_version(self, version: int) -> None:
        for state in self.shards.values():
            state.version = version

    def values(self) -> dict[tuple[int, int], torch.Tensor]:
        """Current value of each shard this server holds, keyed by (tensor_id, offset)."""
        return {key: s.param for key, s in self.shards.items()}

    def workers_gone(self) -> set[int]:
        """Workers that took part (sent the right plan digest) and then said goodbye or failed on
        their control flow (the module docstring's rule).

        A connection under a worker's id that never joined -- a stray client that sent a malformed
        frame or a BYE -- does not count, nor does a spare connection of a joined worker's id: neither
        may make a server think its workers are gone.
        """
        with self.pool.cond:
            return self.pool.departed() & self.joined

    def serve_until_workers_leave(self, timeout: float | None = None) -> None:
        """Block until every worker said goodbye or failed, or until `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.pool.cond:
            while len(self.workers_gone()) < self.workers:
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
                everyone = len(self.workers_gone()) >= self.workers
                failure, failed_at = self.failure, self._failed_at
            if failure is not None and (everyone or time.monotonic() > failed_at + abort_grace):
                raise failure
            if everyone:
                return

    def peer_left(self, flow) -> None:
        if not self.pool.other_flows_up(flow):
            self._forget_pulls(flow.peer_id)

    def _forget_pulls(self, worker: int) -> None:
        """Drop a gone connection's pending PULLs: a later connection under that id did not ask."""
        for state in self.shards.values():
            with state.lock:
                state.waiting_pulls.pop(worker, None)

    def flow_failed(self, flow, exc: TransportError) -> None:
        """A worker's control flow broke: tell every other worker, so none waits for the timeout.

        Malformed frames (ProtocolError) only cost the sender its connection, and so does any
        failure of a connection that is not a worker's control flow or whose worker never joined
        (sent the plan digest): a stray or hostile client cannot end the job.
        """
        if not self.pool.other_flows_up(flow):   # one of its connections cut: its pulls still stand
            self._forget_pulls(flow.peer_id)
        if isinstance(exc, ProtocolError) or not self.pool.is_peer_flow(flow) \
                or flow.peer_id not in self.joined or flow.peer_done \
                or self.pool.has_left(flow.peer_id) or self.pool.closed:
            return
        reason = exc.reason if isinstance(exc, PeerAborted) else f"worker {flow.peer_id} failed ({exc})"
        with self.pool.cond:
            if self.failure is not None:
                return
            self.failure = TransportError(f"server {self.index}: {reason}")
            self._failed_at = time.monotonic()
        self.pool.abort(f"server {self.index}: {reason}", skip_peer=flow.peer_id)

    # -- frames from workers ------------------------------------------------------------------
    def _shard_for(self, flow, header) -> ServerShard:
        state = self.shards.get((header.tensor_id, header.offset))
        if state is None or state.shard.length != header.length \
                or header.dtype != self.specs[header.tensor_id].dtype:
            raise ProtocolError(f"{header.describe()} from {flow.name} is not a shard of server "
                                f"{self.index}")
        return state

    def destination(self, flow, header) -> memoryview:
        if flow.peer_id not in self.joined:
            raise ProtocolError(f"{flow.name} sent {header.kind.name} before agreeing on the shard plan "
                                "(PLAN digest)")
        if header.kind == Kind.STEP and self.step_frames:
            return self._step_destination(flow, header)
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

    def _step_destination(self, flow, header) -> memoryview:
        if header.tensor_id != len(self.specs) or header.offset != 0 \
                or header.length != self.step_length or header.dtype != torch.float64:
            raise ProtocolError(f"{header.describe()} from {flow.name} is not a STEP frame of this job")
        key = (header.iteration, flow.peer_id)
        with self.step_lock:
            if key in self.step_buffers or flow.peer_id in self.steps.get(header.iteration, {}):
                raise ProtocolError(f"{flow.name} sent STEP {header.iteration} twice")
            vector = self.step_buffers[key] = torch.empty(self.step_length, dtype=torch.float64)
        return byte_view(vector)

    def delivered(self, flow, header) -> None:
        if header.kind == Kind.STEP:
            with self.step_lock:   # counted once its payload is in place
                vector = self.step_buffers.pop((header.iteration, flow.peer_id))
                self.steps.setdefault(header.iteration, {})[flow.peer_id] = vector
            self._advance(header.iteration)
            return
        state = self._shard_for(flow, header)
        with state.lock:
            state.arrived.add(flow.peer_id)
            if not state.complete:
                return
            iteration = state.version
        self._shard_complete(state, iteration)

    def _absent(self, flow, header, payload: bytes) -> None:
        """ABSENT: the worker had no gradient for this shard (--ps-pull ahead): a zero push, marked."""
        if flow.peer_id not in self.joined or len(payload) != 8:
            raise ProtocolError(f"malformed ABSENT frame from {flow.name}")
        state = self.shards.get((header.tensor_id, int.from_bytes(payload, "big")))
        if state is None:
            raise ProtocolError(f"ABSENT for tensor {header.tensor_id} from {flow.name} names no shard of "
                                f"server {self.index}")
        worker = flow.peer_id
        with state.lock:
            if header.iteration != state.version or worker in state.arrived:
                raise ProtocolError(f"{flow.name} sent ABSENT for iteration {header.iteration} of tensor "
                                    f"{header.tensor_id}, the shard is at {state.version} "
                                    f"({'already pushed' if worker in state.arrived else 'out of step'})")
            state.grads[worker].zero_()   # the mean is that of DDP's zeros for unused parameters
            state.absent.add(worker)
            state.arrived.add(worker)
            if not state.complete:
                return
            iteration = state.version
        self._shard_complete(state, iteration)

    def _shard_complete(self, state: ServerShard, iteration: int) -> None:
        if self.step_frames:
            self._advance(iteration)
        else:
            self._update([state], StepPlan(), iteration)

    def _advance(self, iteration: int) -> None:
        """Apply iteration `iteration` to every shard that can take it now."""
        with self.step_lock:
            received = self.steps.get(iteration, {})
            if len(received) < self.workers:
                return
            plan = self.step_plans.get(iteration)
            if plan is None:
                plan = self.step_plans[iteration] = self._agree(iteration, received)
                if plan is None:
                    return
            ready = [s for s in self.shards.values()
                     if s.version == iteration and s.complete and s.shard.key not in plan.taken]
            if plan.clip is not None and len(ready) + len(plan.taken) < len(self.shards):
                return   # the norm needs every shard's mean gradient
            plan.taken.update(s.shard.key for s in ready)
            if not ready and plan.done == len(self.shards):
                self._forget(iteration)
                return
        self._update(ready, plan, iteration)

    def _agree(self, iteration: int, received: dict) -> "StepPlan | None":
        """The plan of an iteration from every worker's STEP vector; they must agree."""
        first = received[0]
        settings = first[:self.step_length - len(self.specs)]
        for worker, vector in sorted(received.items()):
            if not torch.equal(vector[:len(settings)], settings):
                self._fail_job(f"server {self.index}: worker {worker}'s optimizer settings at "
                               f"iteration {iteration} differ from worker 0's (every worker must run "
                               "the same schedule and the same clipping)")
                return None
        presence = torch.stack([v[len(settings):] for v in received.values()]).amax(0) > 0
        clip = (float(first[1]), float(first[2])) if first[0] > 0 else None
        hyper = first[STEP_HEADER:len(settings)].tolist()
        return StepPlan(hyper=hyper, clip=clip, presence=presence.tolist())

    def _update(self, shards: list[ServerShard], plan: StepPlan, iteration: int) -> None:
        grads = [state.mean_gradient() for state in shards]
        if plan.clip is not None and shards:
            plan.scale = self._clip_scale(iteration, plan, shards, grads)
        for state, grad in zip(shards, grads):
            with state.lock:
                state.update(grad, plan, self.optimizer, self.offsets)
                state.version += 1
                state.arrived.clear()
                state.absent.clear()
                ready = sorted(w for w, v in state.waiting_pulls.items() if v == state.version)
                for worker in ready:
                    del state.waiting_pulls[worker]
            for worker in ready:
                self._send_param(worker, state)
        if self.step_frames:
            with self.step_lock:
                plan.done += len(shards)
                if plan.done == len(self.shards):
                    self._forget(iteration)

    def _forget(self, iteration: int) -> None:
        self.steps.pop(iteration, None)
        self.step_plans.pop(iteration, None)

    def _clip_scale(self, iteration: int, plan: StepPlan, shards, grads) -> float:
        """torch.nn.utils.clip_grad_norm_'s factor for the whole averaged gradient."""
        max_norm, norm_type = plan.clip
        partial = 0.0
        for state, grad in zip(shards, grads):
            if not state.present(plan):
                continue
            values = grad.double().abs()
            if math.isinf(norm_type):
                partial = max(partial, float(values.max())) if values.numel() else partial
            else:
                partial += float(values.pow(norm_type).sum())
        if self.servers > 1:
            if self.norm_exchange is None:
                raise ConfigError("clipping by the global norm with several servers needs a "
                                  "norm_exchange")
            partials = self.norm_exchange(iteration, partial)
        else:
            partials = [partial]
        total = combine_norm(partials, norm_type)
        return min(max_norm / (total + 1e-6), 1.0)

    def _fail_job(self, reason: str) -> None:
        with self.pool.cond:
            if self.failure is not None:
                return
            self.failure = TransportError(reason)
            self._failed_at = time.monotonic()
        log.error("%s", reason)
        self.pool.abort(reason)

    def control(self, flow, header, payload: bytes) -> None:
        if header.kind == Kind.PLAN:
            if payload != self.digest:
                log.warning("%s has another shard plan than server %d", flow.name, self.index)
            else:
                with self.pool.cond:   # before the answer: the worker pushes once it has it
                    self.joined.add(flow.peer_id)
            flow.send((-1,), encode_control(Kind.PLAN, self.digest, job_id=self.config.job_id))
            return
        if header.kind == Kind.STATE:
            self._state_request(flow, payload)
            return
        if header.kind == Kind.ABSENT:
            self._absent(flow, header, payload)
            return
        if header.kind != Kind.PULL:
            raise ProtocolError(f"unexpected {header.kind.name} control frame from {flow.name}")
        worker, iteration = flow.peer_id, header.iteration
        stale = []
        for state in self.shards.values():
            with state.lock:
                if state.version < iteration:
                    state.waiting_pulls[worker] = iteration
                    continue
                if state.version > iteration:   # that version is gone: answering would send another
                    stale.append(state.shard.tensor_id)
                    continue
            self._send_param(worker, state)
        if stale:
            log.warning("%s pulled iteration %d, but server %d's shards of tensors %s are at a later "
                        "version; ignored that stale pull", flow.name, iteration, self.index,
                        sorted(set(stale)))

    def _state_request(self, flow, payload: bytes) -> None:
        """Save or load optimizer state as a worker asked; answer b"ok" or the error."""
        try:
            request = json.loads(payload)
            op, key = request["op"], request["key"]
            if op not in ("save", "load", "checkpoint") or not isinstance(key, str):
                raise ValueError(op)
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"malformed STATE request from {flow.name}") from None
        try:
            if self.state_exchange is None:
                raise ConfigError("this server cannot save or load optimizer state")
            self.state_exchange(self, op, key)
            answer = b"ok"
        except Exception as exc:  # noqa: BLE001 -- the worker reports it
            answer = f"server {self.index}: {exc}".encode()[:200]
        flow.send((-1, next_sequence()), encode_control(Kind.STATE, answer, job_id=self.config.job_id))

    def _send_param(self, worker: int, state: ServerShard) -> None:
        """Queue a shard's value for a worker; a worker that has left or failed is skipped.

        This runs on whichever worker's receive thread completed the shard's step: a failure to
        reach another worker must not be raised there (it would close the wrong worker's flow).
        """
        shard = state.shard
        header = encode_header(Kind.PARAM, job_id=self.config.job_id, iteration=state.version,
                               tensor_id=shard.tensor_id, offset=shard.offset, length=shard.length,
                               dtype=state.dtype_code, priority=shard.priority)
        key = self.policy.send_key(state.version, shard.priority, shard.urgency, next_sequence())
        try:
            # A worker's other class flows may still be between ACCEPT and registration when its
            # PULL (on flow 0) arrives: wait for them unless the worker has said goodbye (a failed
            # worker ends the wait at once, a silent one after the timeout).
            flow = self.pool.flow(worker, self.policy.flow_of(shard.priority),
                                  wait=not self.pool.has_left(worker))
        except TransportError as exc:
            log.warning("server %d: not sending tensor %d to worker %d, which is gone: %s",
                        self.index, shard.tensor_id, worker, exc)
            return
        flow.send(key, header, state.param_bytes)
