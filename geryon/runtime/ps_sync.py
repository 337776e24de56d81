"""PS mode inside a worker: the optimizer step becomes push gradients / pull parameters.

`ParameterServerSync.attach()` returns a `PSOptimizer` (geryon.runtime.ps_optimizer) that stands in
for the user's optimizer when the servers run it (an elementwise torch.optim class; otherwise the
workers step, geryon.runtime.ps_worker_step).
Each gradient is pushed to the parameter servers as soon as backward has produced it (a
post-accumulate-grad hook; geryon.transport's PSWorker sends each slice on its priority class's
flow), so pushing overlaps the rest of backward, as in DDP; `step()` pushes what backward did not
touch and asks for the next parameters; nothing is updated locally. As with DDP, every backward
pass communicates: call step() after each one (no gradient accumulation over several passes).
The servers run the user's torch.optim class with its parameter groups (geryon.transport.server_optimizer)
on the mean gradient, so W workers follow the curve of one process on the union of their batches.
Each step() also sends a STEP frame: the groups' numeric hyper-parameters as they are at that
moment (so schedulers, warm-up and manual edits apply at the next update, exactly as in one
process), a clipping request (PSOptimizer.clip_grad_norm_), and which tensors had a gradient (a
tensor without one on every worker is left alone, as torch.optim does). Gradients travel as
backward produces them, so a change to .grad between backward and step() (clip_grad_norm_ from
torch.nn.utils, a manual edit) cannot reach the servers: step() detects it and stops with an error
instead of training differently. Buffers (BatchNorm statistics) are broadcast from worker 0 before
every training forward, as DDP does (geryon.runtime.ps_buffers).

With --ps-pull ahead the STEP frame and the pull of the next version leave with the first gradient
of backward instead (`_pull_ahead`): the servers update each slice once every worker pushed it and
send it back at once, so the dense layers whose gradients come first return while backward still
runs. The settings must then stay as they were until step() (checked there), clipping by the
global norm is refused, a tensor without a gradient is an ABSENT frame per slice (PSWorker.push_absent),
and a forward pass, state_dict() or load between backward and step() is an error (they would see
the parameters half replaced); a forward recomputed inside backward (activation checkpointing) does
not wait. The results are bit-equal to pulling at step().

The overlap that priority is for: every module gets a forward pre-hook that waits only for its own
parameters (`PSWorker.wait_param`), so layer 1 computes while later layers' parameters still
arrive; urgent (early) layers are in class 0 and jump the queue.
Every other read of the model or the optimizer after step() (parameters(), `model[0].weight`,
param_groups, state_dict(), ...) waits for the values it reads (geryon.runtime.ps_reads): step()
marks them pending, a wait marks them current.

Setup happens on the model's first forward call (a pre-hook on the model), because the urgency
ranking needs a sample input: rank parameters (geryon.runtime.priorities), check every worker has
the same class assignment, then worker 0 publishes the servers' starting point in the job's store
under `<prefix>ps/spec` -- the initial parameter values (torch.save bytes), the (class, urgency) of
each tensor, the optimizer spec (JSON) and any optimizer state already loaded, in chunks the store
accepts (geryon.runtime.store_blobs) -- and every worker reads the servers' addresses
(`<prefix>ps/server/<j>`), connects, and pulls version 0, so all workers start from worker 0's
values whatever their own initialisation was. A job resuming from a server checkpoint
(geryon.runtime.server_checkpoint) pulls version `resumed_step` instead and counts on from there.

With --priority search (geryon.runtime.search_sync) each step also times the iteration; when the
search moves to another threshold, the switch happens right after that step, before the next
forward: the worker waits for the pull it just asked for (every push of the iteration was
applied, every parameter holds the new version), worker 0 publishes the new (class, urgency) per
tensor under `<prefix>ps/switch/<n>` (every worker waits for it, so no server sees its workers
leave before the switch is announced), every worker leaves the servers, and joins them again at
`<prefix>ps/switch/<n>/server/<j>` with the new classes and the same iteration count. The servers
(geryon.runtime.server) rebuild their flows and shards from their current values, optimizer state and
version, so no update is lost or applied twice.
"""

import atexit
import io
import json
import logging
import time

from geryon.errors import ConfigError
from geryon.runtime import jobtransport
from geryon.runtime.priorities import decide_priorities, search_plan, tensor_priorities
from geryon.runtime.ps_buffers import BufferBroadcast
from geryon.runtime.store_blobs import put_blob

log = logging.getLogger(__name__)

PS_DEVICES = ("cpu", "cuda")   # where a worker's parameters may live (CUDA ones are staged: ps_worker)

SPEC_KEY = "ps/spec"
SERVER_KEY = "ps/server/{index}"
SWITCH_KEY = "ps/switch/{switch}"
SWITCHED_SERVER_KEY = "ps/switch/{switch}/server/{index}"


def check_ps_parameters(params) -> None:
    """A PS worker reads and writes its parameters in place: contiguous, on the CPU or a CUDA GPU."""
    for index, param in enumerate(params):
        if param.device.type not in PS_DEVICES:
            raise ConfigError(f"--mode ps trains parameters on the CPU or a CUDA GPU: parameter {index} is on "
                              f"{param.device}; move the model to one of them")
        if not param.is_contiguous():
            raise ConfigError(f"--mode ps needs contiguous parameters: parameter {index} is not; make it "
                              "contiguous before geryon.distribute() (param.data = param.data.contiguous())")


def server_key(index: int, switch: int = 0) -> str:
    """Store key of server `index`'s address after `switch` class switches (0: the first one)."""
    if switch == 0:
        return SERVER_KEY.format(index=index)
    return SWITCHED_SERVER_KEY.format(switch=switch, index=index)


def encode_priorities(priorities) -> bytes:
    return json.dumps([list(p) for p in priorities]).encode()


def decode_priorities(data: bytes) -> list[tuple[int, int]]:
    return [tuple(p) for p in json.loads(data)]


def encode_spec(values, priorities, optimizer_spec, states=None) -> bytes:
    """The servers' starting point: values, (class, urgency) per tensor, optimizer spec, state.

    `optimizer_spec` is an OptimizerSpec, stored as its JSON text; `states` (per tensor a dict of
    optimizer state, or None) only holds tensors and numbers. Read back with weights_only=True.
    """
    import torch

    buffer = io.BytesIO()
    torch.save({"values": [v.detach().to("cpu", copy=True) for v in values], "priorities": priorities,
                "optimizer": optimizer_spec.to_json(), "states": states}, buffer)
    return buffer.getvalue()


def decode_spec(data: bytes) -> dict:
    import torch

    from geryon.transport.server_optimizer import OptimizerSpec

    spec = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")   # a GPU worker's state too
    spec["optimizer"] = OptimizerSpec.from_json(spec["optimizer"])
    return spec


class SetUpOnFirstForward:
    """Connects a PS worker in the model's first forward pre-hook, once: the inputs decide priorities.

    Subclasses set `self.model`, `self.worker = None` and `self._setting_up = False` and define
    `_set_up(args, kwargs)`, which assigns `self.worker`; a forward run inside `_set_up` (the
    categorizer's probe) is not hooked.
    A copy of the model (copy.deepcopy, swa_utils.AveragedModel) carries the hooks along: it shares
    this object instead of copying its connections, and every hook acts on the trained model only
    (`module is self.model`; a per-layer wait on a copy waits for the trained layer, harmless), so
    the copy is a plain local model.
    """

    def __deepcopy__(self, memo):
        return self

    def _hook_layers_and_gradients(self) -> None:
        """Per module that owns some of `self.params`, a forward pre-hook `self._waiter(module, name,
        tensors)` (it waits for those tensors); per parameter, a hook `self._gradient_ready(tensor)`
        that hands its gradient on once backward has accumulated it."""
        index = {id(p): i for i, p in enumerate(self.params)}
        for name, module in self.model.named_modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if mine:
                module.register_forward_pre_hook(self._waiter(module, name or "model", mine))
        for tensor, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self._gradient_ready(tensor))

    def _first_forward(self, module, args, kwargs):
        if self.worker is not None or self._setting_up or module is not self.model:
            return None
        self._setting_up = True
        try:
            self._set_up(args, kwargs)
        finally:
            self._setting_up = False
        return None


class ParameterServerSync(SetUpOnFirstForward):
    """A worker's side of PS training: setup on first forward, per-layer waits, push/pull steps."""

    def __init__(self, model, optimizer, job, timeline=None, spec=None):
        from geryon.transport.server_optimizer import describe_optimizer

        self.model, self.optimizer, self.job, self.timeline = model, optimizer, job, timeline
        self.params = list(model.parameters())
        check_ps_parameters(self.params)
        self.spec = spec or describe_optimizer(optimizer, self.params)
        self.clip = None           # (max_norm, norm_type) asked for this step
        self.present = [False] * len(self.params)   # tensors with a gradient in this iteration
        self.buffers = BufferBroadcast(model)
        self.checkpoints = None    # geryon.runtime.ps_checkpoint.Checkpoints, once joined
        self.step_checkpoints = None   # worker 0 with --ps-checkpoint-every: server_checkpoint.StepCheckpoints
        self.worker = None
        self.grad_buffers = None
        self.pushed: set[int] = set()  # tensors pushed in this iteration
        self._setting_up = False
        self.search = None
        self.config = None
        self.store = None
        self.prefix = job.store_prefix
        self.pull_ahead = job.ps_pull == "ahead"
        self.sent_step = None      # --ps-pull ahead: the STEP vector sent when this backward began
        self.backward_ended = False

    def attach(self):
        """Hook the model (setup on first forward, per-layer waits); return the optimizer stand-in."""
        from geryon.runtime.ps_optimizer import PSOptimizer
        from geryon.runtime.ps_reads import ParameterReads

        self.reads = ParameterReads(self.model, self.optimizer.param_groups, self.params, self._wait_for_read,
                                    self.wait_all)
        self.model.register_forward_pre_hook(self._first_forward, with_kwargs=True, prepend=True)
        self.model.register_forward_pre_hook(self.buffers.hook, prepend=True)
        # a pull still under way would overwrite what model.load_state_dict() writes
        self.model.register_load_state_dict_pre_hook(self._wait_all_for)
        self.model.register_load_state_dict_post_hook(self._model_loaded)
        # model.state_dict() right after step() would otherwise hold the previous parameters
        self.model.register_state_dict_pre_hook(self._wait_all_for)
        self.optimizer.register_step_pre_hook(_replaced)
        self._hook_layers_and_gradients()
        atexit.register(self.close)
        return PSOptimizer(self.optimizer, self)

    def _wait_all_for(self, module, *_args) -> None:
        if module is self.model:
            self.wait_all()

    def _model_loaded(self, module, incompatible_keys) -> None:
        """model.load_state_dict() after setup: the servers take the loaded values (every worker)."""
        if module is self.model and self.worker is not None and self.checkpoints is not None \
                and not self.checkpoints.loading:
            self.checkpoints.load(self.worker, state=False)

    # -- setup --------------------------------------------------------------------------------
    def _set_up(self, args, kwargs) -> None:
        tracer = self.timeline.transfer if self.timeline else None
        config = self.config = jobtransport.transport_config(self.job, tracer=tracer)
        store = self.store = jobtransport.open_store(self.job)
        job = self.job
        if job.priority == "search":
            self.search, priorities, how = search_plan(
                self.model, args, kwargs, config.classes, store, self.prefix, job,
                {"mode": "ps", "policy": config.policy, "servers": job.servers})
            assignment = self.search.assignment
        else:
            assignment, priorities, how = decide_priorities(
                self.model, args, kwargs, job.priority, config.classes, store, self.prefix, job.rank,
                job.world_size)
        from geryon.runtime.ps_checkpoint import Checkpoints, current_states
        from geryon.transport.server_optimizer import describe_optimizer

        self.spec = describe_optimizer(self.optimizer, self.params)  # settings made since distribute()
        states = current_states(self.optimizer, self.params)  # state loaded before training
        self.optimizer.state.clear()
        if job.is_main:
            put_blob(store, self.prefix + SPEC_KEY, encode_spec(self.params, priorities, self.spec, states))
            log.info("geryon: %s classes by %s: %s bytes per class", assignment.method, how,
                     assignment.bytes_per_class())
        self.worker = self._join_servers(priorities, switch=0)
        if job.is_main:
            log_placement(self.worker, self.config.placement)
        if job.resumed_step:   # a server checkpoint's buffers, before the pull makes reads wait
            from geryon.runtime.server_checkpoint import load_buffers

            load_buffers(job.ps_checkpoint_dir, job.resumed_step, self.model)
        # everyone starts from the servers' values: worker 0's, or a server checkpoint's at resumed_step
        self.worker.iteration = job.resumed_step
        self.worker.pull(job.resumed_step)
        self.reads.mark_pending()
        self.step_checkpoints = self._step_checkpoints()
        self.checkpoints = Checkpoints(self.optimizer, self.params, store, self.prefix, job.rank)

    def _join_servers(self, priorities, switch: int):
        from geryon.transport import PSWorker

        servers = []
        for index in range(self.job.servers):
            address = self.store.get(self.prefix + server_key(index, switch)).decode()
            host, port = address.rsplit(":", 1)
            servers.append((host, int(port)))
        return PSWorker(self.job.rank, self.job.world_size, servers, self.params, self.config, priorities)

    def _switch_classes(self, assignment, switch: int) -> None:
        """Drain, leave the servers, join them again with `assignment`'s classes (same iteration)."""
        started = time.time()
        priorities = tensor_priorities(self.model, assignment)
        key = self.prefix + SWITCH_KEY.format(switch=switch)
        self.worker.wait_all()  # this iteration's pushes are applied and its parameters are here
        if self.job.is_main:
            self.store.set(key, encode_priorities(priorities))
        if decode_priorities(self.store.get(key)) != [tuple(p) for p in priorities]:
            raise ConfigError(f"worker {self.job.rank} computed other classes than worker 0 for "
                              f"search switch {switch}")
        iteration = self.worker.iteration
        old, self.worker = self.worker, None
        old.close()
        worker = self._join_servers(priorities, switch)
        worker.iteration = worker.pull_iteration = iteration
        self.worker = worker
        if self.timeline is not None:
            self.timeline.span(f"search switch {switch}", "search", started, time.time())

    # -- training -----------------------------------------------------------------------------
    def _waiter(self, module, name: str, tensors: list[int]):
        def wait(_module, _inputs):   # on a copy of the model: waits for the original's layer
            if self.worker is None or self._setting_up:
                return None
            if self.sent_step is not None:   # pulled ahead: between the first push and step()
                if self.backward_ended:
                    raise ConfigError(
                        f"forward pass of {name} between backward and optimizer.step() with --ps-pull "
                        "ahead: the next parameters are already replacing these, so it would mix two "
                        "versions. Run it before backward or after step(), or use --ps-pull end")
                return None   # recomputed inside backward (activation checkpointing): this version
            started = time.time()
            for tensor in tensors:
                self.worker.wait_param(tensor)
            self.reads.mark_current(module)
            if self.timeline is not None:
                self.timeline.span(f"wait params {name}", "wait", started, time.time())
            return None

        return wait

    def _gradient_ready(self, tensor: int):
        def push(param):
            if self.worker is None or param.grad is None:
                return
            if tensor in self.pushed:
                raise ConfigError("--mode ps pushes each gradient as backward produces it (like DDP's "
                                  "allreduce): call optimizer.step() after every backward pass; "
                                  "gradient accumulation over several backward passes is not supported")
            if not self.pushed:
                self.worker.wait_all()  # the previous pull must be complete before pushing again
                if self.pull_ahead:
                    self._pull_ahead()
            buffer = self._buffer(tensor)
            buffer.copy_(param.grad)  # a copy: the push is asynchronous, .grad may change
            self.worker.push_tensor(tensor, buffer)
            self.pushed.add(tensor)
            self.present[tensor] = True

        return push

    def _buffer(self, tensor: int):
        import torch

        if self.grad_buffers is None:
            self.grad_buffers = [torch.zeros_like(p) for p in self.params]
        return self.grad_buffers[tensor]

    def _step_vector(self, present):
        """The STEP frame: clip request, the groups' numeric settings now, presence per tensor."""
        import torch

        from geryon.transport.server_optimizer import check_groups, hyper_vector

        groups = check_groups(self.optimizer.param_groups, self.spec)
        clip = (1.0, *self.clip) if self.clip is not None else (0.0, 0.0, 0.0)
        return torch.tensor([*clip, *hyper_vector(groups, self.spec), *(1.0 if p else 0.0 for p in present)],
                            dtype=torch.float64)

    def _pull_ahead(self, in_backward: bool = True) -> None:
        """--ps-pull ahead, as backward starts: send this iteration's settings, ask for the next version.

        Every tensor is marked present; one without a gradient is told per shard at step()
        (PSWorker.push_absent). Each server then updates a shard once its last push is in and sends
        it back at once, while this backward still runs: the big late layers pushed first return
        first. Safe for backward itself: a tensor's new value needs this worker's own push of its
        gradient, which autograd makes after the last use of that tensor.
        """
        import torch

        self.sent_step = self._step_vector([True] * len(self.params))
        self.backward_ended = not in_backward
        if in_backward:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        self.worker.send_step(self.sent_step)
        self.worker.pull(self.worker.iteration + 1)
        self.reads.mark_pending()

    def _backward_end(self) -> None:
        self.backward_ended = True

    def _check_settings_kept(self) -> None:
        """--ps-pull ahead: the settings sent as backward began must still hold at step()."""
        import torch

        now = self._step_vector([True] * len(self.params))
        if not torch.equal(now, self.sent_step):
            raise ConfigError(
                "the optimizer's settings (lr, momentum, ...) changed between backward and "
                "optimizer.step(): with --ps-pull ahead they travel to the servers when backward "
                "starts. Change them before backward (a scheduler's step() after optimizer.step() does) "
                "or use --ps-pull end")

    def request_clip(self, max_norm: float, norm_type: float) -> None:
        import math

        if not (max_norm >= 0 and (norm_type > 0 or math.isinf(norm_type))):
            raise ConfigError(f"clip_grad_norm_({max_norm}, norm_type={norm_type}): max_norm must be "
                              ">= 0 and norm_type positive or inf")
        if self.pull_ahead:
            raise ConfigError("clip_grad_norm_ with --ps-pull ahead: clipping by the global norm needs "
                              "every gradient before any update, so the servers cannot update the first "
                              "layers early; use --ps-pull end (the default when the servers step)")
        self.clip = (max_norm, norm_type)

    def push_pull(self) -> None:
        """Push what backward did not (unused parameters: zeros), send the step's settings, pull."""
        if self.worker is None:
            raise ConfigError("optimizer.step() before the model's first forward pass")
        if not self.pushed:
            self.worker.wait_all()
        self._check_unchanged()
        if self.pull_ahead:
            if self.sent_step is None:   # backward produced no gradient: begin the iteration here
                self._pull_ahead(in_backward=False)
            self._check_settings_kept()
        for tensor, param in enumerate(self.params):
            if tensor in self.pushed:
                continue
            buffer = self._buffer(tensor)
            if param.grad is not None:
                buffer.copy_(param.grad)
                self.present[tensor] = True
            elif self.pull_ahead:
                self.worker.push_absent(tensor)
                continue
            else:
                buffer.zero_()
            self.worker.push_tensor(tensor, buffer)
        if not self.pull_ahead:
            self.worker.send_step(self._step_vector(self.present))
        self.pushed.clear()
        self.clip = None
        self.present = [False] * len(self.params)
        self.worker.iteration += 1
        if self.pull_ahead:
            self.sent_step = None
        else:
            self.worker.pull(self.worker.iteration)
            self.reads.mark_pending()
        if self.search is not None:
            switched = self.search.iteration_done()
            if switched is not None:
                self._switch_classes(switched, self.search.switch_count)
        if self.step_checkpoints is not None:
            self.step_checkpoints.after_step(self.worker)

    def _step_checkpoints(self):
        """Worker 0's server checkpoints every K steps (--ps-checkpoint-every), or None."""
        job = self.job
        if not (job.ps_checkpoint_every and job.ps_checkpoint_dir):
            return None
        if self.spec.mean_only:
            raise ConfigError("--ps-checkpoint-every saves the optimizer the servers run, but the workers "
                              f"step {type(self.optimizer).__name__} themselves: save the script's own "
                              "checkpoint instead, or use an optimizer the servers can run "
                              "(docs/ps-optimizers.md)")
        if not job.is_main:
            return None
        from geryon.runtime.server_checkpoint import StepCheckpoints

        return StepCheckpoints(job.ps_checkpoint_dir, job.ps_checkpoint_every, job.servers, self.model)

    def _check_unchanged(self) -> None:
        """Gradients already sent must not have changed since (they would not reach the servers)."""
        import torch

        for tensor in self.pushed:
            grad = self.params[tensor].grad
            if grad is None or not torch.equal(grad, self.grad_buffers[tensor]):
                raise ConfigError(
                    "a gradient changed between backward and optimizer.step() (torch.nn.utils."
                    "clip_grad_norm_, or an edit of .grad?): in --mode ps gradients go to the servers "
                    "as backward produces them, so the change would be lost. Clip with "
                    "optimizer.clip_grad_norm_(max_norm) or geryon.clip_grad_norm_(optimizer, "
                    "max_norm) (the servers clip the averaged gradient by its global norm), or let "
                    "the workers step (--ps-optimizer worker), where .grad holds the averaged "
                    "gradient after backward")

    def state_dict(self) -> dict:
        """The optimizer's state_dict, its state gathered from the servers (torch's format)."""
        if self.worker is None or self.checkpoints is None:
            return self.optimizer.state_dict()
        return self.checkpoints.state_dict(self.worker)

    def load_state_dict(self, state_dict) -> None:
        """Load settings here and state (and the model's current values) onto the servers.

        Call it on every worker, as with DDP; before the first forward pass it only loads locally
        and the state travels with the servers' starting point.
        """
        self.optimizer.load_state_dict(state_dict)
        if self.worker is not None and self.checkpoints is not None:
            self.checkpoints.load(self.worker, state=True)

    def wait_all(self) -> None:
        if self.sent_step is not None:
            raise ConfigError("the model's or optimizer's state between backward and optimizer.step() "
                              "with --ps-pull ahead: its parameters are being replaced by the next "
                              "version. Save or load after step(), or use --ps-pull end")
        if self.worker is not None:
            self.worker.wait_all()
        self.reads.mark_current()

    def _wait_for_read(self, tensors) -> bool:
        """A read of the model or optimizer outside the forward (geryon.runtime.ps_reads): wait."""
        if self.sent_step is not None:
            # --ps-pull ahead, between the first push and step(): reads of .grad are fine, values
            # are being replaced (a forward, state_dict() or load fails, see wait_all)
            return False
        if self.worker is not None:
            for tensor in tensors:
                self.worker.wait_param(tensor)
        return True

    def close(self) -> None:
        """Wait for the last pull (so the model holds the final values), then leave the servers."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        if self.sent_step is not None:
            log.warning("geryon: stopped between backward and optimizer.step(); with --ps-pull ahead "
                        "the parameters may mix two versions")
            worker.close()
            return
        try:
            worker.wait_all()
            self.reads.mark_current()
        except Exception as exc:  # noqa: BLE001 -- at exit: report, never hang
            log.warning("geryon: last parameters did not arrive: %s", exc)
        worker.close()


def _replaced(optimizer, args, kwargs):
    raise ConfigError("this optimizer was replaced by geryon.distribute(): in --mode ps call step() on "
                      "the optimizer it returned (model, optimizer = geryon.distribute(model, optimizer))")


def log_placement(worker, placement: str) -> None:
    """Worker 0's line on how the slices are spread (--ps-placement), printed like the optimizer's."""
    load = worker.bytes_per_server
    print(f"geryon: --mode ps: {len(worker.plan)} slices over {len(load)} servers by {placement}: "
          f"{load} bytes per server (the busiest {max(load) * len(load) / max(1, sum(load)):.2f}x the mean)",
          flush=True)
