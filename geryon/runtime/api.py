"""The in-script API: two lines turn a single-process PyTorch training script into a geryon worker.

    import geryon
    ctx = geryon.init()                                      # rank, world size, mode, policy, ...
    model, optimizer = geryon.distribute(model, optimizer)  # then train as usual

`init()` reads the job from the environment once (`geryon.runtime.env.RankEnv`): under
`python -m geryon.launch`, under plain `torchrun`, under Slurm, or alone (one process, nothing
distributed). It sets up torch.distributed (gloo) when there is more than one worker. Under torchrun
or Slurm the ranks a ps job names as servers serve inside init() and exit when the job ends
(geryon.runtime.engines; docs/engines.md).

`distribute()` makes the updates of all workers identical, equal to one process training on the
union of their batches:
  allreduce  the model is wrapped in DistributedDataParallel with the DDP options given to
             distribute() (users keep DDP; an already wrapped model is kept); under geryon.launch its
             buckets travel over geryon's priority flows (geryon.runtime.ddp_sync), elsewhere over gloo.
             With --overlap next-forward there is no DDP: the model comes back with per-layer
             waits and the optimizer with a stand-in that updates each parameter as soon as its
             bucket is reduced (geryon.runtime.ddp_overlap).
  ps         under geryon.launch, an elementwise torch.optim optimizer (SGD, Adam, AdamW, RMSprop,
             Adagrad, ...) runs on the parameter servers: the model gets per-layer forward
             pre-hooks that wait only for their own parameters, and the optimizer is replaced by a
             torch.optim.Optimizer stand-in whose step() pushes gradients and the groups' current
             settings and pulls the new parameters (geryon.runtime.ps_sync, ps_optimizer); any other
             optimizer runs on the workers, the servers averaging gradients into .grad at the end
             of backward (geryon.runtime.ps_worker_step). GERYON_PS_OPTIMIZER (--ps-optimizer)
             forces one side. Buffers are broadcast from worker 0 before each training forward
             (DDP's convention). Clip with geryon.clip_grad_norm_(optimizer, max_norm), which is
             torch's own everywhere except where the servers step. Without servers (plain
             torchrun, Slurm) gradients are averaged with gloo before the user's own step
             (`GradientAverageSync`), the same update a synchronous parameter server computes.
A job of one worker has nothing to synchronise and trains locally (a ps job's servers stay idle).
Which DDP features each mode keeps (no_sync, unused parameters, static graph, autocast, SyncBatchNorm,
torch.compile, checkpoints, join) is tabulated in docs/ddp-compat.md; DDP options a mode cannot
honour fail in distribute(), before training (geryon.runtime.ddp_options).
After step(), whatever reads the model or the optimizer sees that step's values (in ps mode
each read waits for the parameters it reads, geryon.runtime.ps_reads); `wait_parameters(model)`
makes current a tensor held from before step().
With `--timeline FILE`, forward/backward per layer and every transfer are
recorded for the job's trace (geryon.timeline).
"""

import atexit
from datetime import timedelta

from geryon.errors import ConfigError
from geryon.gloo_buffers import KeptBuffers, broadcast_in_place, copy_back
from geryon.quickexit import exit_without_collecting
from geryon.runtime import env as rank_env
from geryon.runtime.engines import join_engine_job
from geryon.runtime.env import RankEnv

DEFAULT_BACKEND = "gloo"

# older names of RankEnv and its parser, kept for scripts that use them
JobContext = RankEnv
read_context = RankEnv.from_environ

_context: RankEnv | None = None


def init(backend: str = DEFAULT_BACKEND, timeout: timedelta = timedelta(minutes=5)) -> RankEnv:
    """Join the job described by the environment; set up torch.distributed when there are several workers.

    When this process sees CUDA, the rank's GPU (by LOCAL_RANK) becomes the current CUDA device and
    `ctx.device` names it; otherwise `ctx.device` is the CPU."""
    global _context
    exit_without_collecting()   # this process imported torch: its exit need not collect torch's objects
    context = rank_env.current()
    join_engine_job(context, backend, timeout)   # an engine's server ranks serve here and exit
    from geryon.runtime.device import use_rank_device

    use_rank_device(context.local_rank)
    if context.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            if context.launcher == "slurm":
                if not context.master_addr:
                    raise ConfigError("under Slurm, set MASTER_ADDR or SLURM_STEP_NODELIST")
                init_method = f"tcp://{context.master_addr}:{context.master_port}"
            else:
                init_method = "env://"
            from geryon.transport.config import DEFAULT_RTO_MAX_MS
            from geryon.transport.flows import cap_retransmission_backoff, tcp_sockets

            before = tcp_sockets()
            dist.init_process_group(backend, init_method=init_method, rank=context.rank,
                                    world_size=context.world_size, timeout=timeout)
            # gloo's connections recover from a link outage as fast as geryon's flows (loss logging,
            # buffer broadcasts and the gloo fallbacks run on them every iteration)
            cap_retransmission_backoff(DEFAULT_RTO_MAX_MS, skip=before)
            atexit.register(_leave)
    _context = context
    return context


def context() -> RankEnv:
    """The context `init()` returned (init() is called if it was not)."""
    return _context if _context is not None else init()


def distribute(model, optimizer, job: RankEnv | None = None, **ddp_options):
    """Return (model, optimizer) whose training steps are synchronised across the job's workers.

    With geryon's transport (a job started by geryon.launch): allreduce mode gives a
    DistributedDataParallel whose buckets go over geryon's flows; ps mode gives the model back with
    per-layer waits and a stand-in optimizer whose step() pushes gradients and pulls parameters.
    Without it (plain torchrun or Slurm: no job secret, or no servers), gloo does the same work.
    `ddp_options` are DistributedDataParallel's own keywords (find_unused_parameters, static_graph,
    bucket_cap_mb, ...), passed to it in allreduce mode; in ps mode any of them set to a value
    other than DDP's default is refused (geryon.runtime.ddp_options).
    """
    job = job or context()
    from geryon.runtime import ddp_options as options
    from geryon.timeline import rank_timeline

    options.check_ddp_options(ddp_options, job.mode, job.has_transport)
    options.refuse_cpu_sync_batchnorm(model)
    if job.mode == "ps":
        options.refuse_wrapped_in_ps(model)
        options.refuse_device_parameters_in_ps(model)
    timeline = rank_timeline(job.timeline, job.name)
    if job.mode != "ps":   # before partial allreduce's own step hook: a slow worker is late to its group
        _maybe_straggle(model, optimizer, job)
    model, optimizer = _synchronised(model, optimizer, job, timeline, ddp_options)
    if job.mode == "ps":   # the optimizer that steps may be the stand-in that pushes to the servers
        _maybe_straggle(model, optimizer, job)
    if job.mode == "ps":
        options.install_ps_stand_ins(model)
    if timeline is not None:  # after the PS waits, so that a layer's span starts when it can compute
        timeline.watch_module(model.module if hasattr(model, "module") else model)
    return model, optimizer


def _synchronised(model, optimizer, job: RankEnv, timeline, ddp_options: dict):
    if not job.distributed:
        return model, optimizer
    transport = job.has_transport
    if job.mode == "ps":
        if transport and job.servers > 0:
            return model, _parameter_servers(model, optimizer, job, timeline)
        GradientAverageSync(model, optimizer, job).attach()
        return model, optimizer
    from geryon.syncmodes import parse_sync

    sync = parse_sync(job.sync)
    if sync.partial and transport:
        from geryon.runtime.partial_sync import attach_partial

        if ddp_options:
            raise ConfigError(f"--sync {sync.text()} keeps the model unwrapped (each worker steps alone, "
                              f"then averages with its group), so DDP's options {sorted(ddp_options)} do "
                              "not apply: drop them, or use --sync full")
        attach_partial(model, optimizer, job, sync, timeline)
        return model, optimizer
    if transport and job.overlap == "next-forward":
        from geryon.runtime.ddp_overlap import OverlappedAllreduce

        return model, OverlappedAllreduce(model, optimizer, job, timeline, ddp_options).attach()
    from geryon.runtime.ddp_options import wrap_ddp

    ddp = wrap_ddp(model, ddp_options)
    if transport:
        from geryon.runtime.ddp_sync import attach_geryon_hook

        attach_geryon_hook(ddp, job, timeline, optimizer=optimizer)
    return ddp, optimizer


def _maybe_straggle(model, optimizer, job: RankEnv) -> None:
    """--straggler RANK:FACTOR: this worker, if it is RANK, computes FACTOR times slower."""
    from geryon.syncmodes import parse_straggler

    straggler = parse_straggler(job.straggler)
    if straggler is not None and job.role != "server" and straggler.rank == job.rank and optimizer is not None:
        from geryon.runtime.straggler import slow_down

        slow_down(model, optimizer, straggler.factor)


def average_replicas() -> None:
    """With --sync partial: end it, every worker averaging its model with all the others, so every
    replica is equal (call it on every worker before evaluating or saving; it also runs at exit).
    Returns at once in any other mode, where the replicas are equal after every step."""
    from geryon.runtime.partial_sync import average_replicas as finish

    finish()


def _parameter_servers(model, optimizer, job: RankEnv, timeline):
    """Hook `model` for PS training; the optimizer to train with (the stand-in, or the user's own)."""
    from geryon.runtime.ps_optimizer import choose_update, describe_choice

    mode, spec, why = choose_update(optimizer, list(model.parameters()), job.ps_optimizer)
    if job.is_main:
        print(describe_choice(optimizer, mode, why, job.servers), flush=True)
    if mode == "server":
        from geryon.runtime.ps_sync import ParameterServerSync

        return ParameterServerSync(model, optimizer, job, timeline, spec=spec).attach()
    from geryon.runtime.ps_worker_step import WorkerStepSync

    return WorkerStepSync(model, optimizer, job, timeline).attach()


def wait_parameters(model) -> None:
    """Wait until every parameter of `model` holds the values of the last optimizer.step().

    Reads through the model or the optimizer (parameters(), state_dict(), `model[0].weight`,
    param_groups, ...) already wait for what they read in --mode ps (geryon.runtime.ps_reads); call
    this before using a tensor held in a variable from before step(). Returns at once in any other
    mode, where step() leaves the parameters current.
    """
    from geryon.runtime.ps_reads import wait_parameters as wait

    wait(model.module if hasattr(model, "module") else model)


def clip_grad_norm_(optimizer, max_norm: float, norm_type: float = 2.0):
    """Clip the gradients by the global norm of the averaged gradient, whatever the mode.

    torch.nn.utils.clip_grad_norm_ over the optimizer's parameters (returning the norm), except in
    --mode ps with the servers stepping, where the servers clip the averaged gradient (returns None).
    """
    from geryon.runtime.ps_optimizer import clip_grad_norm_ as clip

    return clip(optimizer, max_norm, norm_type)


class GradientAverageSync:
    """PS mode without geryon's transport (no job secret or no servers: torchrun, Slurm).

    When backward ends, the gradients are averaged across workers with one flat gloo all_reduce:
    the same update a synchronous parameter server computes, and .grad holds the average before
    the user clips or steps (so torch.nn.utils.clip_grad_norm_ clips by the global norm).
    """

    def __init__(self, model, optimizer, job: RankEnv):
        self.model, self.optimizer, self.job = model, optimizer, job
        self._queued = False
        self._kept = KeptBuffers()

    def attach(self) -> None:
        """Start every worker from rank 0's parameters and hook the end of every backward pass."""
        # once, at the start: buffers dropped on return (only a rank's last collectives need keeping)
        broadcast_in_place(list(self.model.parameters()) + list(self.model.buffers()), KeptBuffers())
        for param in self.model.parameters():
            param.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, param) -> None:
        if not self._queued:
            import torch

            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self._queued = False
        self.average_gradients()

    def average_gradients(self) -> None:
        """Average the gradients of all workers in place (one flat all_reduce)."""
        import torch.distributed as dist

        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        if not grads:
            return
        flat = self._kept.flat("gradients", grads)
        dist.all_reduce(flat)
        flat /= self.job.world_size
        copy_back(flat, grads)


_AVERAGE_BUFFERS = KeptBuffers()   # never a temporary for gloo (geryon.gloo_buffers)


def average(value: float) -> float:
    """The mean of `value` over all workers (for logging a global loss); `value` itself when alone."""
    job = context()
    if not job.distributed:
        return float(value)
    import torch
    import torch.distributed as dist

    tensor = _AVERAGE_BUFFERS.get("average", 1, torch.float64)
    tensor.fill_(float(value))
    dist.all_reduce(tensor)
    return float(tensor.item()) / job.world_size


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
