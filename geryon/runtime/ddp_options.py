"""DistributedDataParallel's own options, as `geryon.distribute(model, optimizer, **ddp_options)` takes them.

allreduce  the options go to `DistributedDataParallel(model, **ddp_options)` unchanged
           (find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb,
           broadcast_buffers, init_sync, mixed_precision, ...); under geryon.launch its comm hook is
           then registered on the result (geryon.runtime.ddp_sync). A model the user already wrapped in
           DistributedDataParallel is kept as it is (the options belong to that constructor then).
           Refused under geryon's transport: `process_group` / `device_mesh` (geryon's hook averages
           over every worker of the job, not over a subgroup), and a DDP that already has a comm hook.
ps         there is no DistributedDataParallel: a DDP option set to anything but DDP's default has no
           meaning and fails here, before training starts, naming the option and why. The returned
           model gets `no_sync()` and `join()` stand-ins that fail the same way (a DDP script calls
           them; PS mode cannot honour them, see docs/ddp-compat.md).

Every check runs whatever the number of workers, so a script that a single process accepts is one
a job accepts. Names are DDP's own, read from its signature (an unknown name is a typo: refused).
"""

import inspect
from functools import lru_cache

from geryon.errors import ConfigError

COMPAT_DOC = "docs/ddp-compat.md"

# Why each DDP option has no meaning in --mode ps (the parameter servers replace DDP's reducer).
PS_REASONS = {
    "find_unused_parameters": "the PS worker pushes a zero gradient for every parameter that backward "
                              "did not reach, so an unused parameter never stalls it",
    "static_graph": "there is no DDP reducer to specialise: each gradient is pushed as backward "
                    "produces it",
    "gradient_as_bucket_view": "there are no DDP buckets: gradients are sliced per tensor by --policy",
    "bucket_cap_mb": "there are no DDP buckets: gradients are sliced per tensor by --policy",
    "bucket_cap_mb_list": "there are no DDP buckets: gradients are sliced per tensor by --policy",
    "batched_grad_copy": "there are no DDP buckets to copy gradients into",
    "broadcast_buffers": "there is no DDP forward pass to broadcast buffers in",
    "forward_sync_buffers": "there is no DDP forward pass to synchronise buffers in",
    "init_sync": "every worker always starts from worker 0's parameters, pulled from the servers",
    "process_group": "the servers serve every worker of the job",
    "device_mesh": "the servers serve every worker of the job",
    "device_ids": "a PS worker trains its model on the device the model is on",
    "output_device": "a PS worker trains its model on the device the model is on",
    "dim": "there is no DDP scatter of inputs",
    "check_reduction": "there is no DDP reducer",
    "delay_all_reduce_named_params": "there is no allreduce: gradients go to the servers",
    "param_to_hook_all_reduce": "there is no allreduce: gradients go to the servers",
    "mixed_precision": "gradients travel in their own dtype to the servers",
    "skip_all_reduce_unused_params": "there is no allreduce: gradients go to the servers",
}
# Refused under geryon's transport in allreduce mode: its hook reduces over the whole job.
WHOLE_JOB_ONLY = ("process_group", "device_mesh")


@lru_cache(maxsize=1)
def ddp_defaults() -> dict:
    """DDP's keyword options and their defaults, from this torch's DistributedDataParallel.__init__."""
    from torch.nn.parallel import DistributedDataParallel

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return {name: p.default for name, p in parameters.items() if name not in ("self", "module")}


# Values DDP treats as its default although the signature says None (buffers are synchronised).
SAME_AS_DEFAULT = {"broadcast_buffers": True, "forward_sync_buffers": True}


def _is_default(name: str, value) -> bool:
    default = ddp_defaults()[name]
    if value is default or (name in SAME_AS_DEFAULT and value is SAME_AS_DEFAULT[name]):
        return True
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 -- a value that cannot compare (a tensor, a group) is not a default
        return False


def check_ddp_options(options: dict, mode: str, transport: bool) -> None:
    """Refuse options DDP does not have, and options that mean nothing in this mode (ConfigError)."""
    known = ddp_defaults()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"geryon.distribute(): {', '.join(unknown)} "
                          f"{'is not an option' if len(unknown) == 1 else 'are not options'} of "
                          f"torch's DistributedDataParallel (its options: {', '.join(known)})")
    if mode == "ps":
        for name, value in options.items():
            if not _is_default(name, value):
                raise ConfigError(
                    f"geryon.distribute(..., {name}={value!r}): a DistributedDataParallel option, which "
                    f"has no meaning in --mode ps ({PS_REASONS.get(name, 'there is no DDP in PS mode')}); "
                    f"drop it when geryon.init().mode == 'ps', or use --mode allreduce "
                    f"(see {COMPAT_DOC})")
        return
    if transport:
        for name in WHOLE_JOB_ONLY:
            if name in options and not _is_default(name, options[name]):
                raise ConfigError(f"geryon.distribute(..., {name}=...): under geryon.launch the gradients "
                                  f"are averaged over every worker of the job by geryon's own allreduce; "
                                  f"a subgroup is not supported (drop {name})")


def is_ddp(model) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def wrap_ddp(model, options: dict):
    """`model` in DistributedDataParallel with the user's options; an already wrapped model as it is."""
    from torch.nn.parallel import DistributedDataParallel

    if is_ddp(model):
        if options:
            raise ConfigError(f"geryon.distribute(): the model is already a DistributedDataParallel, so "
                              f"{', '.join(sorted(options))} belong to its constructor; pass them there, "
                              f"or give distribute() the bare model with the options")
        return model
    return DistributedDataParallel(model, **options)


def refuse_wrapped_in_ps(model) -> None:
    """PS mode replaces DDP: a model already wrapped in it would allreduce its gradients as well."""
    if is_ddp(model):
        raise ConfigError("--mode ps replaces DistributedDataParallel by parameter servers: give "
                          "geryon.distribute() the bare model (model.module), not the DDP wrapper, or use "
                          "--mode allreduce")


def refuse_cpu_sync_batchnorm(model) -> None:
    """PyTorch's SyncBatchNorm refuses CPU inputs at its first forward; say so before training."""
    from torch import nn

    for name, module in model.named_modules():
        if isinstance(module, nn.SyncBatchNorm) and any(
                t.device.type == "cpu" for t in (*module.parameters(), *module.buffers())):
            raise ConfigError(f"{name or 'the model'} is a SyncBatchNorm on CPU: PyTorch's SyncBatchNorm "
                              "only runs on GPU/XPU tensors, and geryon trains CPU modules; keep "
                              "nn.BatchNorm (statistics per worker, buffers from worker 0 as in DDP) "
                              f"(see {COMPAT_DOC})")


def refuse_device_parameters_in_ps(model) -> None:
    """--mode ps trains parameters on the CPU or a CUDA GPU (its workers' pushes and pulls read and
    write them in place, CUDA ones through pinned host staging); any other device is refused before
    training (docs/gpu.md)."""
    from geryon.runtime.ps_sync import PS_DEVICES

    for name, param in model.named_parameters():
        if param.device.type not in PS_DEVICES:
            raise ConfigError(f"--mode ps trains parameters on the CPU or a CUDA GPU: {name} is on "
                              f"{param.device}; move the model to one of them, or use --mode allreduce "
                              "(see docs/gpu.md)")


def install_ps_stand_ins(model) -> None:
    """Give a PS-mode model `no_sync()` and `join()` that fail clearly, as a DDP script would call them.

    Only where the model's class does not define them itself.
    """
    for name, message in (
            ("no_sync", "model.no_sync() (gradient accumulation) is not supported in --mode ps: each "
                        "gradient is pushed to the servers as backward produces it; step after every "
                        "backward, or use --mode allreduce"),
            ("join", "model.join() (uneven inputs) is not supported in --mode ps: the servers wait for "
                     "every worker's gradients at every step; give every worker the same number of "
                     "batches (e.g. DistributedSampler(drop_last=True)), or use --mode allreduce")):
        if hasattr(model, name):
            continue

        def refuse(*_args, _message=message, **_kwargs):
            raise ConfigError(f"{_message} (see {COMPAT_DOC})")

        object.__setattr__(model, name, refuse)
