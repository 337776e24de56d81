"""PS mode inside a worker: the optimizer step becomes push gradients / pull parameters.

`ParameterServerSync.attach()` returns a `PSOptimizer` that stands in for the user's optimizer.
Each gradient is pushed to the parameter servers as soon as backward has produced it (a
post-accumulate-grad hook; geryon.transport's PSWorker sends each slice on its priority class's
flow), so pushing overlaps the rest of backward, as in DDP; `step()` pushes what backward did not
touch and asks for the next parameters; nothing is updated locally. As with DDP, every backward
pass communicates: call step() after each one (no gradient accumulation over several passes).
The servers run the same `torch.optim.SGD` (lr, momentum, dampening, weight decay, nesterov taken
from the user's optimizer) on the mean gradient, so W workers follow the curve of one process on
the union of their batches. The servers take the SGD settings once, at the first forward call:
a learning-rate schedule applied to the worker's optimizer later does not reach them.

The overlap that priority is for: every module gets a forward pre-hook that waits only for its own
parameters (`PSWorker.wait_param`), so layer 1 computes while later layers' parameters still
arrive; urgent (early) layers are in class 0 and jump the queue.

Setup happens on the model's first forward call (a pre-hook on the model), because the urgency
ranking needs a sample input: rank parameters (geryon.runtime.priorities), check every worker has
the same class assignment, then worker 0 publishes the servers' starting point in the job's store
under `<prefix>ps/spec` -- the initial parameter values (torch.save bytes), the (class, urgency) of
each tensor and the SGD settings, in chunks the store accepts (geryon.runtime.store_blobs) -- and every worker reads the servers' addresses
(`<prefix>ps/server/<j>`), connects, and pulls version 0, so all workers start from worker 0's
values whatever their own initialisation was.

With --priority search (geryon.runtime.search_sync) each step also times the iteration; when the
search moves to another threshold, the switch happens right after that step, before the next
forward: the worker waits for the pull it just asked for (every push of the iteration was
applied, every parameter holds the new version), worker 0 publishes the new (class, urgency) per
tensor under `<prefix>ps/switch/<n>` (every worker waits for it, so no server sees its workers
leave before the switch is announced), every worker leaves the servers, and joins them again at
`<prefix>ps/switch/<n>/server/<j>` with the new classes and the same iteration count. The servers
(geryon.runtime.server) rebuild their flows and shards from their current values, momentum and
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
from geryon.runtime.store_blobs import put_blob

log = logging.getLogger(__name__)

SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
SPEC_KEY = "ps/spec"
SERVER_KEY = "ps/server/{index}"
SWITCH_KEY = "ps/switch/{switch}"
SWITCHED_SERVER_KEY = "ps/switch/{switch}/server/{index}"


def server_key(index: int, switch: int = 0) -> str:
    """Store key of server `index`'s address after `switch` class switches (0: the first one)."""
    if switch == 0:
        return SERVER_KEY.format(index=index)
    return SWITCHED_SERVER_KEY.format(switch=switch, index=index)


def encode_priorities(priorities) -> bytes:
    return json.dumps([list(p) for p in priorities]).encode()


def decode_priorities(data: bytes) -> list[tuple[int, int]]:
    return [tuple(p) for p in json.loads(data)]


def sgd_settings(optimizer, params) -> dict:
    """The SGD keywords of `optimizer`, checked to be something the servers can run."""
    import torch

    if type(optimizer) is not torch.optim.SGD:
        raise ConfigError(f"--mode ps runs the optimizer on the parameter servers, which run "
                          f"torch.optim.SGD; this script uses {type(optimizer).__name__} "
                          "(use SGD, or --mode allreduce)")
    if len(optimizer.param_groups) != 1:
        raise ConfigError("--mode ps supports an SGD optimizer with one parameter group "
                          f"(this one has {len(optimizer.param_groups)})")
    group = optimizer.param_groups[0]
    if [id(p) for p in group["params"]] != [id(p) for p in params]:
        raise ConfigError("--mode ps: the optimizer must hold exactly model.parameters(), in order")
    if group.get("maximize"):
        raise ConfigError("--mode ps: SGD(maximize=True) is not supported")
    return {key: group[key] for key in SGD_KEYS}


def encode_spec(values, priorities, sgd: dict) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"values": [v.detach().clone() for v in values], "priorities": priorities, "sgd": sgd},
               buffer)
    return buffer.getvalue()


def decode_spec(data: bytes) -> dict:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


class PSOptimizer:
    """Stands in for the user's optimizer in PS mode: `step()` pushes and pulls, nothing local."""

    def __init__(self, optimizer, sync: "ParameterServerSync"):
        self.optimizer, self.sync = optimizer, sync

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.sync.push_pull()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Wait until every parameter holds the servers' latest version (e.g. before saving)."""
        self.sync.wait_all()

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


class ParameterServerSync:
    """A worker's side of PS training: setup on first forward, per-layer waits, push/pull steps."""

    def __init__(self, model, optimizer, job, timeline=None):
        self.model, self.optimizer, self.job, self.timeline = model, optimizer, job, timeline
        self.params = list(model.parameters())
        for param in self.params:
            if param.device.type != "cpu" or not param.is_contiguous():
                raise ConfigError("--mode ps needs contiguous CPU parameters")
        self.sgd = sgd_settings(optimizer, self.params)
        self.worker = None
        self.grad_buffers = None
        self.pushed: set[int] = set()  # tensors pushed in this iteration
        self._setting_up = False
        self.search = None
        self.config = None
        self.store = None
        self.prefix = job.store_prefix

    def attach(self) -> PSOptimizer:
        """Hook the model (setup on first forward, per-layer waits); return the optimizer stand-in."""
        self.model.register_forward_pre_hook(self._first_forward, with_kwargs=True, prepend=True)
        index = {id(p): i for i, p in enumerate(self.params)}
        for name, module in self.model.named_modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if mine:
                module.register_forward_pre_hook(self._waiter(name or "model", mine))
        for tensor, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self._gradient_ready(tensor))
        atexit.register(self.close)
        return PSOptimizer(self.optimizer, self)

    # -- setup --------------------------------------------------------------------------------
    def _first_forward(self, module, args, kwargs):
        if self.worker is not None or self._setting_up:
            return None
        self._setting_up = True
        try:
            self._set_up(args, kwargs)
        finally:
            self._setting_up = False
        return None

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
        if job.is_main:
            put_blob(store, self.prefix + SPEC_KEY, encode_spec(self.params, priorities, self.sgd))
            log.info("geryon: %s classes by %s: %s bytes per class", assignment.method, how,
                     assignment.bytes_per_class())
        self.worker = self._join_servers(priorities, switch=0)
        self.worker.pull(0)  # everyone starts from the servers' (worker 0's) values

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
    def _waiter(self, name: str, tensors: list[int]):
        def wait(_module, _inputs):
            if self.worker is None or self._setting_up:
                return None
            started = time.time()
            for tensor in tensors:
                self.worker.wait_param(tensor)
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
            buffer = self._buffer(tensor)
            buffer.copy_(param.grad)  # a copy: the push is asynchronous, .grad may change
            self.worker.push_tensor(tensor, buffer)
            self.pushed.add(tensor)

        return push

    def _buffer(self, tensor: int):
        import torch

        if self.grad_buffers is None:
            self.grad_buffers = [torch.zeros_like(p) for p in self.params]
        return self.grad_buffers[tensor]

    def push_pull(self) -> None:
        """Push what backward did not (unused parameters: zeros), then ask for the new parameters."""
        if self.worker is None:
            raise ConfigError("optimizer.step() before the model's first forward pass")
        if not self.pushed:
            self.worker.wait_all()
        for tensor, param in enumerate(self.params):
            if tensor in self.pushed:
                continue
            buffer = self._buffer(tensor)
            if param.grad is None:
                buffer.zero_()
            else:
                buffer.copy_(param.grad)
            self.worker.push_tensor(tensor, buffer)
        self.pushed.clear()
        self.worker.iteration += 1
        self.worker.pull(self.worker.iteration)
        if self.search is not None:
            switched = self.search.iteration_done()
            if switched is not None:
                self._switch_classes(switched, self.search.switch_count)

    def wait_all(self) -> None:
        if self.worker is not None:
            self.worker.wait_all()

    def close(self) -> None:
        """Wait for the last pull (so the model holds the final values), then leave the servers."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        try:
            worker.wait_all()
        except Exception as exc:  # noqa: BLE001 -- at exit: report, never hang
            log.warning("geryon: last parameters did not arrive: %s", exc)
        worker.close()
