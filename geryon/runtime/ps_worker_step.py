"""PS mode with the workers stepping: the servers average gradients, every worker runs the optimizer.

For optimizers the servers cannot run exactly on slices (LAMB, LARS, Adafactor, a subclass, ...;
chosen by geryon.runtime.ps_optimizer.choose_update, or `--ps-optimizer worker`), as BytePS does:
the servers run `OptimizerSpec(MEAN)` -- a shard's value is the mean of the workers' gradients --
and the user's optimizer itself is returned unchanged.
The averages are asked for with the first push of backward (--ps-pull auto or ahead; `end`: once
backward ends), so each server sends every averaged shard as soon as its last push is in, while
backward still runs; they land in separate buffers, so the parameters are never touched early.

Each gradient is pushed as backward produces it (a post-accumulate-grad hook, like DDP); the first
one of a backward pass queues a callback that runs when backward ends: it pushes what backward did
not touch, pulls the averaged gradients and writes them into .grad. After `loss.backward()` every
worker holds the gradient of the global batch, so torch.nn.utils.clip_grad_norm_, gradient
inspection, schedulers, state_dict() and the step itself are those of one process. Unused
parameters: a tensor without a gradient on every worker keeps .grad None (an extra one-element-
per-tensor "presence" tensor is averaged with the gradients), as torch.optim and DDP expect.
Parameters start from worker 0's values (published in the store with the servers' spec) and stay
equal because every worker applies the same update to the same gradients. Buffers follow DDP's
convention (geryon.runtime.ps_buffers).
"""

import atexit

from geryon.errors import ConfigError
from geryon.runtime import jobtransport
from geryon.runtime.priorities import decide_priorities
from geryon.runtime.ps_buffers import BufferBroadcast
from geryon.runtime.ps_sync import (SPEC_KEY, SetUpOnFirstForward, check_ps_parameters, decode_spec, encode_spec,
                                    log_placement, server_key)
from geryon.runtime.store_blobs import get_blob, put_blob


class WorkerStepSync(SetUpOnFirstForward):
    """A worker's side of PS training where the servers average and the workers step."""

    def __init__(self, model, optimizer, job, timeline=None):
        self.model, self.optimizer, self.job, self.timeline = model, optimizer, job, timeline
        self.params = list(model.parameters())
        check_ps_parameters(self.params)
        if job.priority == "search":
            raise ConfigError("--priority search is not supported when the workers step "
                              "(--ps-optimizer worker): use --priority coarse or threshold=T")
        self.buffers = BufferBroadcast(model)
        self.worker = None
        self.pushes = None       # per tensor: a copy of the gradient being pushed
        self.averages = None     # per tensor: where the averaged gradient lands (+ presence)
        self.pushed: set[int] = set()
        self.present = None
        self._queued = False
        self._setting_up = False
        # --ps-pull auto|ahead: the averages are asked for with the first push, so each comes back
        # while backward runs; they land in self.averages, never in the parameters, so this is safe
        self.pull_ahead = job.ps_pull != "end"

    def attach(self):
        """Hook the model and its gradients; return the user's optimizer (it runs here)."""
        self.model.register_forward_pre_hook(self._first_forward, with_kwargs=True, prepend=True)
        self.model.register_forward_pre_hook(self.buffers.hook, prepend=True)
        for tensor, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self._gradient_ready(tensor))
        atexit.register(self.close)
        return self.optimizer

    def _set_up(self, args, kwargs) -> None:
        import torch

        from geryon.transport import PSWorker
        from geryon.transport.server_optimizer import MEAN, OptimizerSpec

        tracer = self.timeline.transfer if self.timeline else None
        job = self.job
        config = jobtransport.transport_config(job, tracer=tracer)
        store = jobtransport.open_store(job)
        prefix = job.store_prefix
        _assignment, priorities, _how = decide_priorities(
            self.model, args, kwargs, job.priority, config.classes, store, prefix, job.rank,
            job.world_size)
        priorities = [tuple(p) for p in priorities] + [(0, -1)]   # the presence tensor goes first
        self.averages = [torch.zeros_like(p) for p in self.params] + [torch.zeros(len(self.params))]
        if job.is_main:
            values = [p.detach() for p in self.params] + [self.averages[-1]]
            put_blob(store, prefix + SPEC_KEY, encode_spec(values, priorities, OptimizerSpec(MEAN)))
        start = decode_spec(get_blob(store, prefix + SPEC_KEY))["values"]
        with torch.no_grad():   # every worker starts from worker 0's parameters
            for param, value in zip(self.params, start):
                param.copy_(value)
        servers = []
        for index in range(job.servers):
            host, port = store.get(prefix + server_key(index)).decode().rsplit(":", 1)
            servers.append((host, int(port)))
        self.pushes = [torch.zeros_like(p) for p in self.params] + [torch.zeros(len(self.params))]
        self.present = self.pushes[-1]
        self.worker = PSWorker(job.rank, job.world_size, servers, self.averages, config, priorities)
        if job.is_main:
            log_placement(self.worker, config.placement)

    def _gradient_ready(self, tensor: int):
        def push(param):
            if self.worker is None or param.grad is None:
                return
            if tensor in self.pushed:
                raise ConfigError("a parameter's gradient was produced twice in one backward pass")
            if not self._queued:
                import torch

                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
                if self.pull_ahead:
                    self.worker.pull(self.worker.iteration + 1)
            self.pushes[tensor].copy_(param.grad)
            self.present[tensor] = 1.0
            self.worker.push_tensor(tensor, self.pushes[tensor])
            self.pushed.add(tensor)

        return push

    def _backward_done(self) -> None:
        """End of backward: push the rest, pull the averages, put them in .grad."""
        self._queued = False
        worker = self.worker
        for tensor in range(len(self.params)):
            if tensor not in self.pushed:
                self.pushes[tensor].zero_()
                worker.push_tensor(tensor, self.pushes[tensor])
        worker.push_tensor(len(self.params), self.present)
        worker.iteration += 1
        if worker.pull_iteration < worker.iteration:   # --ps-pull end
            worker.pull(worker.iteration)
        worker.wait_all()
        presence = self.averages[-1]
        for tensor, param in enumerate(self.params):
            if presence[tensor] > 0:
                if param.grad is None:
                    param.grad = self.averages[tensor].clone()
                else:
                    param.grad.copy_(self.averages[tensor])
        self.pushed.clear()
        self.present.zero_()

    def close(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
