"""Allreduce mode with --overlap next-forward: each parameter is updated as soon as its gradients are reduced.

With DDP (--overlap barrier, geryon.runtime.ddp_sync) backward ends only when every bucket is
reduced, step() updates every parameter, and the next forward starts after the last byte: the
order of the buckets on the wire cannot shorten the iteration. Here (ByteScheduler's way) the
iteration boundary is crossed:
  backward   each parameter's gradient is copied into its bucket as autograd produces it (a
             post-accumulate-grad hook); a full bucket is averaged with geryon's ring allreduce
             (`AllreduceGroup.allreduce_async`) on the flow of its class, buckets started in the
             same order on every rank (the ring needs it); the urgent first layers, whose
             gradients come last, go on their class's own flow (--policy geryon), beside the bulk
             still in flight rather than behind it;
  step()     returns at once: it records the groups' settings as they are now and updates the
             parameters of every bucket already reduced; each later bucket is updated by the
             thread that saw its reduction land;
  forward    every module has a forward pre-hook that waits for its own parameters only, so layer 1
             computes while the big late layers still travel.
The update is the user's optimizer, exactly: an elementwise torch.optim class (the allow-list of
geryon.transport.server_optimizer) run per parameter with its group's settings at step() and the user's
optimizer's own state (one `state` dict, so state_dict(), load_state_dict() and checkpoints are
torch's). An optimizer that needs every gradient at once (LAMB, LARS, a subclass) is refused when
distribute() runs, naming --overlap barrier. geryon.clip_grad_norm_(optimizer, max_norm) makes that
step wait for every reduction, clip as torch does, and update everything (clipping by the global norm
needs every gradient). Averaged in the same ring order, the parameters are bit-equal to the barrier
version's (tests/test_allreduce_overlap.py); with three or more workers the sums' order follows the
buckets, which here are cut from the parameters in reverse order at DDP's bucket size, so bits may
then differ from DDP's own buckets within rounding.

Every rank starts from worker 0's parameters and buffers, and buffers are broadcast from worker 0
before every training forward (DDP's convention, geryon.runtime.ps_buffers). Reads of the model or the
optimizer after step() wait for the values they read (geryon.runtime.ps_reads), as in PS mode. A
parameter no worker's backward reached is reduced as zeros at step() (as DDP with
find_unused_parameters does). As with DDP, call step() after every backward (no accumulation).
"""

import atexit
import logging
import threading
import time

from geryon.errors import ConfigError, PeerAborted
from geryon.runtime import jobtransport
from geryon.runtime.ps_buffers import BufferBroadcast
from geryon.runtime.ps_optimizer import PSOptimizer
from geryon.runtime.ps_sync import SetUpOnFirstForward

log = logging.getLogger(__name__)

DEFAULT_BUCKET_MB = 25   # DistributedDataParallel's bucket_cap_mb
ACCEPTED_DDP_OPTIONS = ("bucket_cap_mb", "broadcast_buffers")


def check_optimizer(optimizer, params):
    """The optimizer's OptimizerSpec when it can be run per parameter; ConfigError saying what to do."""
    from geryon.transport.server_optimizer import describe_optimizer

    try:
        return describe_optimizer(optimizer, params)
    except ConfigError as why:
        raise ConfigError(f"--overlap next-forward updates each parameter with the user's optimizer as "
                          f"soon as its gradient is reduced, which needs an elementwise torch.optim class "
                          f"with plain-number settings: {why}. Use --overlap barrier (DDP's update after "
                          "every bucket)") from None


def check_ddp_options(options: dict) -> float:
    """Bucket size in bytes from the DDP options distribute() got; others have no meaning here."""
    from geryon.runtime.ddp_options import _is_default

    for name, value in options.items():
        if name not in ACCEPTED_DDP_OPTIONS and not _is_default(name, value):
            raise ConfigError(f"geryon.distribute(..., {name}={value!r}): with --overlap next-forward there "
                              f"is no DistributedDataParallel (geryon reduces and updates per bucket "
                              f"itself); drop {name}, or use --overlap barrier")
    if options.get("broadcast_buffers") is False:
        raise ConfigError("broadcast_buffers=False with --overlap next-forward: worker 0's buffers are "
                          "always broadcast before each training forward; use --overlap barrier")
    return float(options.get("bucket_cap_mb") or DEFAULT_BUCKET_MB) * 1024 * 1024


class _Bucket:
    """Consecutive parameters (backward order) of one class and dtype, averaged as one flat tensor."""

    def __init__(self, index: int, tensors: list[int], params, priority):
        import torch

        self.index, self.tensors, self.priority = index, tensors, priority
        sizes = [params[t].numel() for t in tensors]
        self.flat = torch.zeros(sum(sizes), dtype=params[tensors[0]].dtype)
        self.views, at = {}, 0
        for tensor, size in zip(tensors, sizes):
            self.views[tensor] = self.flat[at:at + size].view_as(params[tensor])
            at += size
        self.filled: set[int] = set()
        self.launched = False
        self.reduced = False
        self.landed = threading.Event()   # the reduction ended (done or failed)
        self.stepped = False      # step() ran for this reduction; its update is due
        self.zero: bool | None = None   # zero_grad(set_to_none) asked while the update was due
        self.current = threading.Event()   # the parameters hold the last step's values
        self.current.set()
        self.error: BaseException | None = None


def plan_buckets(params, priorities, cap_bytes: float) -> list[list[int]]:
    """Tensor indices per bucket: reverse order (as backward produces them), cut at `cap_bytes` and
    wherever the class or the dtype changes, so a bucket's class is that of every tensor in it."""
    buckets, current, size = [], [], 0
    for tensor in reversed(range(len(params))):
        param = params[tensor]
        nbytes = param.numel() * param.element_size()
        if current and (size + nbytes > cap_bytes or priorities[tensor][0] != priorities[current[0]][0]
                        or param.dtype != params[current[0]].dtype):
            buckets.append(current)
            current, size = [], 0
        current.append(tensor)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


class OverlappedAllreduce(SetUpOnFirstForward):
    """A worker's side of --overlap next-forward: per-bucket reductions, per-parameter updates."""

    def __init__(self, model, optimizer, job, timeline=None, ddp_options=None):
        from geryon.runtime.ddp_options import is_ddp

        if is_ddp(model):
            raise ConfigError("--overlap next-forward reduces and updates per bucket without "
                              "DistributedDataParallel: give geryon.distribute() the bare model (model.module), "
                              "or use --overlap barrier")
        self.model, self.optimizer, self.job, self.timeline = model, optimizer, job, timeline
        self.params = list(model.parameters())
        for param in self.params:
            if param.device.type != "cpu" or not param.is_contiguous():
                raise ConfigError("--overlap next-forward needs contiguous CPU parameters; use --overlap barrier")
        if job.priority == "search":
            raise ConfigError("--priority search with --overlap next-forward is not supported: the search "
                              "switches classes between iterations, which here overlap; use a fixed "
                              "priority (coarse, threshold=T) or --overlap barrier")
        self.spec = check_optimizer(optimizer, self.params)
        self.cap_bytes = check_ddp_options(ddp_options or {})
        self.buffers = BufferBroadcast(model)
        self.lock = threading.Lock()
        self.worker = None          # the AllreduceGroup, once set up (SetUpOnFirstForward's name)
        self.buckets: list[_Bucket] = []
        self.bucket_of: dict[int, _Bucket] = {}
        self.next_launch = 0
        self.settings: list[dict] | None = None   # the groups' settings at the last step()
        self.steppers: dict[int, object] = {}     # tensor -> torch.optim instance over that parameter
        self.clip = None
        self._setting_up = False

    def attach(self):
        """Hook the model and the optimizer; return the optimizer stand-in."""
        from geryon.gloo_buffers import KeptBuffers, broadcast_in_place
        from geryon.runtime.ps_reads import ParameterReads

        broadcast_in_place(self.params + list(self.model.buffers()), KeptBuffers())   # worker 0's start
        self.reads = ParameterReads(self.model, self.optimizer.param_groups, self.params,
                                    self._wait_for_read, self.wait_all)
        self.model.register_forward_pre_hook(self._first_forward, with_kwargs=True, prepend=True)
        self.model.register_forward_pre_hook(self.buffers.hook, prepend=True)
        self.model.register_load_state_dict_pre_hook(self._wait_all_for)
        self.model.register_state_dict_pre_hook(self._wait_all_for)
        self.optimizer.register_step_pre_hook(_replaced)
        self._hook_layers_and_gradients()
        _install_stand_ins(self.model)
        atexit.register(self.close)
        return OverlapOptimizer(self.optimizer, self)

    def _wait_all_for(self, module, *_args) -> None:
        if module is self.model:
            self.wait_all()

    # -- setup --------------------------------------------------------------------------------
    def _set_up(self, args, kwargs) -> None:
        from geryon.runtime.priorities import decide_priorities

        job = self.job
        config = jobtransport.transport_config(job, tracer=self.timeline.transfer if self.timeline else None)
        store = jobtransport.open_store(job)
        assignment, priorities, how = decide_priorities(self.model, args, kwargs, job.priority, config.classes,
                                                        store, job.store_prefix, job.rank, job.world_size)
        for number, tensors in enumerate(plan_buckets(self.params, priorities, self.cap_bytes)):
            prio = (min(priorities[t][0] for t in tensors), min(priorities[t][1] for t in tensors))
            bucket = _Bucket(number, tensors, self.params, prio)
            self.buckets.append(bucket)
            for tensor in tensors:
                self.bucket_of[tensor] = bucket
        group = jobtransport.open_allreduce_group(job, config, store)
        if job.is_main:
            log.info("geryon: %s classes by %s: %s bytes per class; %d buckets", assignment.method, how,
                     assignment.bytes_per_class(), len(self.buckets))
        self.worker = group

    # -- backward: gradients into buckets, buckets onto the ring --------------------------------
    def _gradient_ready(self, tensor: int):
        def ready(param):
            if self.worker is None or param.grad is None or self._setting_up:
                return
            bucket = self.bucket_of[tensor]
            self._wait_current(bucket)   # the last update read this bucket's averaged gradient
            with self.lock:
                if tensor in bucket.filled or bucket.launched:
                    raise ConfigError("--overlap next-forward reduces each gradient as backward produces "
                                      "it (like DDP): call optimizer.step() after every backward pass; "
                                      "gradient accumulation over several passes needs --overlap barrier")
                bucket.views[tensor].copy_(param.grad)
                bucket.filled.add(tensor)
                self._launch_ready()

        return ready

    def _launch_ready(self) -> None:
        """Start every full bucket whose predecessors have started (under self.lock): the same order
        on every rank, whatever order this rank's backward filled them in."""
        while self.next_launch < len(self.buckets):
            bucket = self.buckets[self.next_launch]
            if len(bucket.filled) < len(bucket.tensors):
                return
            bucket.launched, bucket.reduced = True, False
            bucket.landed.clear()
            work = self.worker.allreduce_async([bucket.flat], [bucket.priority], op="avg")
            threading.Thread(target=self._land, args=(bucket, work), daemon=True,
                             name=f"gy-overlap-bucket-{bucket.index}").start()
            self.next_launch += 1

    def _land(self, bucket: _Bucket, work) -> None:
        try:
            work.wait()
        except BaseException as exc:  # noqa: BLE001 -- handed to whoever waits for these parameters
            bucket.error = exc
            bucket.landed.set()
            bucket.current.set()
            return
        with self.lock:
            bucket.reduced = True
            bucket.landed.set()
            due = bucket.stepped
        if due:
            self._update(bucket)

    # -- step: settings now, updates as reductions land -------------------------------------------
    def step(self) -> None:
        if self.worker is None:
            raise ConfigError("optimizer.step() before the model's first forward pass")
        from geryon.transport.server_optimizer import check_groups

        check_groups(self.optimizer.param_groups, self.spec)   # the classes' settings still fit
        settings = [{k: v for k, v in dict.items(group) if k != "params"} for group in self.optimizer.param_groups]
        with self.lock:
            for bucket in self.buckets:   # what no backward reached travels as zeros (every rank the same)
                for tensor in bucket.tensors:
                    if tensor not in bucket.filled:
                        bucket.views[tensor].zero_()
                        bucket.filled.add(tensor)
            self._launch_ready()
            self.next_launch = 0   # every bucket has started: the next backward begins again
            self.settings = settings
            if self.clip is None:
                due = []
                for bucket in self.buckets:
                    bucket.current.clear()
                    bucket.stepped = True
                    if bucket.reduced:
                        due.append(bucket)
        if self.clip is not None:
            self._clip_and_update()
            return
        self.reads.mark_pending()
        for bucket in due:
            self._update(bucket)

    def _clip_and_update(self) -> None:
        """Global-norm clipping needs every averaged gradient: wait for all, clip as torch does, update."""
        import torch

        max_norm, norm_type = self.clip
        self.clip = None
        for bucket in self.buckets:
            _wait_reduced(bucket)
        for bucket in self.buckets:
            self._set_grads(bucket)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        for bucket in self.buckets:
            bucket.current.clear()
            self._update(bucket, grads_set=True)

    def _set_grads(self, bucket: _Bucket) -> None:
        for tensor in bucket.tensors:
            param = self.params[tensor]
            if param.grad is None:
                param.grad = bucket.views[tensor].clone()
            else:
                param.grad.copy_(bucket.views[tensor])

    def _update(self, bucket: _Bucket, grads_set: bool = False) -> None:
        """The user's optimizer over this bucket's parameters, with the settings of the last step()."""
        try:
            if not grads_set:
                self._set_grads(bucket)
            state = self.optimizer.state   # the user's optimizer's (rebound by its load_state_dict)
            for tensor in bucket.tensors:
                group = self.spec.tensor_group[tensor]
                if group < 0:
                    continue
                stepper = self.steppers.get(tensor)
                if stepper is None:
                    stepper = self.steppers[tensor] = self.spec.build(group, self.params[tensor])
                stepper.param_groups[0].update(self.settings[group])
                stepper.state = state
                stepper.step()
        except BaseException as exc:  # noqa: BLE001 -- handed to whoever waits for these parameters
            bucket.error = exc
        with self.lock:
            bucket.filled.clear()
            bucket.launched = bucket.reduced = bucket.stepped = False
            zero, bucket.zero = bucket.zero, None
            if zero is not None:
                _zero((self.params[t] for t in bucket.tensors), zero)
            bucket.current.set()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero .grad now where the parameters are current, else right after their update."""
        with self.lock:
            for bucket in self.buckets or [None]:
                if bucket is not None and not bucket.current.is_set():
                    bucket.zero = set_to_none
                    continue
                tensors = bucket.tensors if bucket is not None else range(len(self.params))
                _zero((self.params[t] for t in tensors), set_to_none)

    def request_clip(self, max_norm: float, norm_type: float) -> None:
        self.clip = (float(max_norm), float(norm_type))

    # -- forward and reads: wait for one's own parameters -------------------------------------
    def _waiter(self, module, name: str, tensors: list[int]):
        def wait(_module, _inputs):
            if self.worker is None or self._setting_up:
                return None
            started = time.time()
            for bucket in {id(self.bucket_of[t]): self.bucket_of[t] for t in tensors}.values():
                self._wait_current(bucket)
            self.reads.mark_current(module)
            if self.timeline is not None:
                self.timeline.span(f"wait params {name}", "wait", started, time.time())
            return None

        return wait

    def _wait_current(self, bucket: _Bucket) -> None:
        bucket.current.wait()
        if bucket.error is not None:
            error = bucket.error
            if isinstance(error, (ConfigError, PeerAborted)):
                raise error
            raise ConfigError(f"the update of bucket {bucket.index} failed: {error!r}") from error

    def _wait_for_read(self, tensors) -> bool:
        if self.worker is not None:
            for tensor in tensors:
                self._wait_current(self.bucket_of[tensor])
        return True

    def wait_all(self) -> None:
        for bucket in self.buckets:
            self._wait_current(bucket)
        self.reads.mark_current()

    def state_dict(self) -> dict:
        self.wait_all()
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.wait_all()
        self.optimizer.load_state_dict(state_dict)

    def close(self) -> None:
        """Wait for the last updates (the model holds the final values), then leave the ring."""
        group, self.worker = self.worker, None
        if group is None:
            return
        try:
            for bucket in self.buckets:
                if bucket.stepped or not bucket.current.is_set():
                    bucket.current.wait(timeout=self.job.transport_timeout)
        finally:
            group.close()


def _wait_reduced(bucket: _Bucket) -> None:
    bucket.landed.wait()
    if bucket.error is not None:
        raise ConfigError(f"the reduction of bucket {bucket.index} failed: {bucket.error!r}")


def _zero(params, set_to_none: bool) -> None:
    """optimizer.zero_grad() over `params`."""
    for param in params:
        if param.grad is None:
            continue
        if set_to_none:
            param.grad = None
        else:
            param.grad.detach_()
            param.grad.zero_()


class OverlapOptimizer(PSOptimizer):
    """The user's optimizer under --overlap next-forward: step() records the settings and updates each
    parameter as its reduction lands; state, schedulers and checkpoints are the user's own."""

    def __repr__(self) -> str:
        return f"OverlapOptimizer({self._inner!r})"

    def _synchronize(self) -> None:
        """Record this step's settings; each parameter is updated as its reduction lands."""
        self._sync.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._sync.zero_grad(set_to_none)

    def add_param_group(self, param_group) -> None:
        raise ConfigError("add_param_group() after geryon.distribute() is not supported with --overlap "
                          "next-forward: give the optimizer every group before distributing")

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clip at this step by the global norm of the averaged gradient (the step then waits for
        every reduction, since the norm needs them all). Returns None."""
        self._sync.request_clip(max_norm, norm_type)


STAND_INS = {
    "no_sync": "model.no_sync() (gradient accumulation) is not supported with --overlap next-forward: each "
               "gradient is reduced as backward produces it; step after every backward, or use --overlap barrier",
    "join": "model.join() (uneven inputs) is not supported with --overlap next-forward: every bucket waits "
            "for every worker's gradients; give every worker the same number of batches, or use "
            "--overlap barrier",
}


def _install_stand_ins(model) -> None:
    """DDP's no_sync() and join(), which a DDP script calls, failing with what to do instead (only
    where the model's class does not define them itself)."""
    for name, message in STAND_INS.items():
        if hasattr(model, name):
            continue

        def refuse(*_args, _message=message, **_kwargs):
            raise ConfigError(f"{_message} (see docs/allreduce-overlap.md)")

        object.__setattr__(model, name, refuse)


def _replaced(optimizer, args, kwargs):
    raise ConfigError("this optimizer was replaced by geryon.distribute(): with --overlap next-forward call "
                      "step() on the optimizer it returned (model, optimizer = geryon.distribute(model, "
                      "optimizer))")
