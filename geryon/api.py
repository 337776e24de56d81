"""The in-script API: two lines turn a single-process PyTorch training script into a geryon worker.

    import geryon
    ctx = geryon.init()                                      # rank, world size, mode, policy, ...
    model, optimizer = geryon.distribute(model, optimizer)  # then train as usual

`init()` reads the job from the environment: under `python -m geryon.launch` (GERYON_* variables),
under plain `torchrun` (RANK, WORLD_SIZE, MASTER_ADDR, ...), under Slurm (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_STEP_NODELIST), or alone (one process, nothing distributed). It sets up
torch.distributed (gloo) when there is more than one worker.

`distribute()` makes the updates of all workers identical, equal to one process training on the
union of their batches:
  allreduce  the model is wrapped in DistributedDataParallel (users keep DDP; an already wrapped
             model is kept); under geryon.launch its buckets travel over geryon's priority flows
             (geryon.launch.ddp_sync), elsewhere over gloo.
  ps         under geryon.launch, an elementwise torch.optim optimizer (SGD, Adam, AdamW, RMSprop,
             Adagrad, ...) runs on the parameter servers: the model gets per-layer forward
             pre-hooks that wait only for their own parameters, and the optimizer is replaced by a
             torch.optim.Optimizer stand-in whose step() pushes gradients and the groups' current
             settings and pulls the new parameters (geryon.launch.ps_sync, ps_optimizer); any other
             optimizer runs on the workers, the servers averaging gradients into .grad at the end
             of backward (geryon.launch.ps_worker_step). GERYON_PS_OPTIMIZER (--ps-optimizer)
             forces one side. Buffers are broadcast from worker 0 before each training forward
             (DDP's convention). Clip with geryon.clip_grad_norm_(optimizer, max_norm), which is
             torch's own everywhere except where the servers step. Without servers (plain
             torchrun, Slurm) gradients are averaged with gloo before the user's own step
             (`GradientAverageSync`), the same update a synchronous parameter server computes.
A job of one worker has nothing to synchronise and trains locally (a ps job's servers stay idle).
With GERYON_TIMELINE set (`--timeline FILE`), forward/backward per layer and every transfer are
recorded for the job's trace (geryon.timeline).
"""

import atexit
import os
import re
from dataclasses import dataclass, field
from datetime import timedelta

from geryon.errors import ConfigError

DEFAULT_BACKEND = "gloo"
SLURM_DEFAULT_PORT_BASE = 20000

_context: "JobContext | None" = None


@dataclass(frozen=True)
class JobContext:
    """Who this process is in the job, as `init()` found it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mode: str = "allreduce"                 # "allreduce" | "ps"
    policy: str = "vanilla"
    priority: str = "coarse"
    classes: str | None = None
    servers: int = 0
    launcher: str = "single"                # "geryon" | "torchrun" | "slurm" | "single"
    job_id: str | None = None
    host_ip: str | None = None
    timeline: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    secret: str | None = field(default=None, repr=False)

    @property
    def distributed(self) -> bool:
        """More than one worker."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0, the one that should print summaries and save checkpoints."""
        return self.rank == 0


def read_context(environ=None) -> JobContext:
    """The job as the environment describes it (geryon.launch, torchrun, Slurm, or a single process)."""
    env = os.environ if environ is None else environ
    geryon = {
        "mode": env.get("GERYON_MODE") or "allreduce",
        "policy": env.get("GERYON_POLICY") or "vanilla",
        "priority": env.get("GERYON_PRIORITY") or "coarse",
        "classes": env.get("GERYON_CLASSES") or None,
        "servers": int(env.get("GERYON_SERVERS") or 0),
        "job_id": env.get("GERYON_JOB_ID"),
        "host_ip": env.get("GERYON_HOST_IP"),
        "timeline": env.get("GERYON_TIMELINE") or None,
        "secret": env.get("GERYON_JOB_SECRET"),
    }
    if geryon["mode"] not in ("allreduce", "ps"):
        raise ConfigError(f"GERYON_MODE={geryon['mode']!r}: use allreduce or ps")
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "geryon" if env.get("GERYON_ROLE") else "torchrun"
        return JobContext(rank=_int(env, "RANK"), world_size=_int(env, "WORLD_SIZE"),
                          local_rank=int(env.get("LOCAL_RANK", 0)), launcher=launcher,
                          master_addr=env.get("MASTER_ADDR"),
                          master_port=int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None,
                          **geryon)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        master_addr = env.get("MASTER_ADDR") or first_slurm_host(
            env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
        master_port = int(env.get("MASTER_PORT") or SLURM_DEFAULT_PORT_BASE
                          + int(env.get("SLURM_JOB_ID", "0")) % 20000)
        return JobContext(rank=_int(env, "SLURM_PROCID"), world_size=_int(env, "SLURM_NTASKS"),
                          local_rank=int(env.get("SLURM_LOCALID", 0)), launcher="slurm",
                          master_addr=master_addr or None, master_port=master_port, **geryon)
    return JobContext(**geryon)


def init(backend: str = DEFAULT_BACKEND, timeout: timedelta = timedelta(minutes=5)) -> JobContext:
    """Join the job described by the environment; set up torch.distributed when there are several workers."""
    global _context
    context = read_context()
    if context.distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            if context.launcher == "slurm":
                if not context.master_addr:
                    raise ConfigError("under Slurm, set MASTER_ADDR or SLURM_STEP_NODELIST")
                init_method = f"tcp://{context.master_addr}:{context.master_port}"
            else:
                init_method = "env://"
            dist.init_process_group(backend, init_method=init_method, rank=context.rank,
                                    world_size=context.world_size, timeout=timeout)
            atexit.register(_leave)
    _context = context
    return context


def context() -> JobContext:
    """The context `init()` returned (init() is called if it was not)."""
    return _context if _context is not None else init()


def distribute(model, optimizer, job: JobContext | None = None):
    """Return (model, optimizer) whose training steps are synchronised across the job's workers.

    With geryon's transport (a job started by geryon.launch): allreduce mode gives a
    DistributedDataParallel whose buckets go over geryon's flows; ps mode gives the model back with
    per-layer waits and a stand-in optimizer whose step() pushes gradients and pulls parameters.
    Without it (plain torchrun or Slurm: no job secret, or no servers), gloo does the same work.
    """
    job = job or context()
    from geryon.timeline import rank_timeline

    timeline = rank_timeline()
    model, optimizer = _synchronised(model, optimizer, job, timeline)
    if timeline is not None:  # after the PS waits, so that a layer's span starts when it can compute
        timeline.watch_module(model.module if hasattr(model, "module") else model)
    return model, optimizer


def _synchronised(model, optimizer, job: JobContext, timeline):
    if not job.distributed:
        return model, optimizer
    from geryon.launch import jobtransport

    transport = jobtransport.has_transport()
    if job.mode == "ps":
        if transport and job.servers > 0:
            return model, _parameter_servers(model, optimizer, job, timeline)
        GradientAverageSync(model, optimizer, job).attach()
        return model, optimizer
    from torch.nn.parallel import DistributedDataParallel

    ddp = model if isinstance(model, DistributedDataParallel) else DistributedDataParallel(model)
    if transport:
        from geryon.launch.ddp_sync import attach_geryon_hook

        attach_geryon_hook(ddp, job, timeline, optimizer=optimizer)
    return ddp, optimizer


def _parameter_servers(model, optimizer, job: JobContext, timeline):
    """Hook `model` for PS training; the optimizer to train with (the stand-in, or the user's own)."""
    from geryon.launch.ps_optimizer import choose_update, describe_choice

    requested = os.environ.get("GERYON_PS_OPTIMIZER") or "auto"
    mode, spec, why = choose_update(optimizer, list(model.parameters()), requested)
    if job.is_main:
        print(describe_choice(optimizer, mode, why, job.servers), flush=True)
    if mode == "server":
        from geryon.launch.ps_sync import ParameterServerSync

        return ParameterServerSync(model, optimizer, job, timeline, spec=spec).attach()
    from geryon.launch.ps_worker_step import WorkerStepSync

    return WorkerStepSync(model, optimizer, job, timeline).attach()


def clip_grad_norm_(optimizer, max_norm: float, norm_type: float = 2.0):
    """Clip the gradients by the global norm of the averaged gradient, whatever the mode.

    torch.nn.utils.clip_grad_norm_ over the optimizer's parameters (returning the norm), except in
    --mode ps with the servers stepping, where the servers clip the averaged gradient (returns None).
    """
    from geryon.launch.ps_optimizer import clip_grad_norm_ as clip

    return clip(optimizer, max_norm, norm_type)


class GradientAverageSync:
    """PS mode without geryon's transport (no job secret or no servers: torchrun, Slurm).

    When backward ends, the gradients are averaged across workers with one flat gloo all_reduce:
    the same update a synchronous parameter server computes, and .grad holds the average before
    the user clips or steps (so torch.nn.utils.clip_grad_norm_ clips by the global norm).
    """

    def __init__(self, model, optimizer, job: JobContext):
        self.model, self.optimizer, self.job = model, optimizer, job
        self._queued = False

    def attach(self) -> None:
        """Start every worker from rank 0's parameters and hook the end of every backward pass."""
        import torch.distributed as dist

        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            dist.broadcast(tensor.data, src=0)
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
        import torch
        import torch.distributed as dist

        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.job.world_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def average(value: float) -> float:
    """The mean of `value` over all workers (for logging a global loss); `value` itself when alone."""
    job = context()
    if not job.distributed:
        return float(value)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor.item()) / job.world_size


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: 'node[03-05,9],gpu1' -> 'node03'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return ""
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _int(env, name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(f"{name}={env[name]!r} is not a whole number") from None


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
