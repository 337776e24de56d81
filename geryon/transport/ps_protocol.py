"""The parameter-server protocol: M servers hold parameter shards; workers push gradients, pull parameters.

The servers are geryon.transport.ps_server.ParameterServer, the workers
geryon.transport.ps_worker.PSWorker; both lay out the shards with `shard_layout`, whose digest they
compare when a worker connects (a PLAN frame), so a mismatch fails before any gradient moves.
Frames are geryon.transport.wire's; the STEP vector's layout is geryon.transport.server_optimizer's.

Iteration protocol (synchronous): a worker at iteration i pushes every gradient shard tagged i; a
server aggregates a shard once all W workers' pushes for i arrived -- the mean, summed in worker
order 0..W-1 -- and applies the user's optimizer to it: the real `torch.optim` class named by the
job's `OptimizerSpec` (geryon.transport.server_optimizer), one instance per shard with the settings of the
shard's parameter group, making the shard's version i + 1. With `OptimizerSpec(MEAN)` the server
only averages: the shard's value is the mean gradient, and the workers run their own optimizer.
A worker's `pull(i + 1)` asks every server for version i + 1 of its shards; each server answers as
shards become ready, through its send queues in urgency order on the class's flow.
Parameters land directly in the worker's tensors; `wait_param(t)` blocks until tensor t is
complete, so the next forward pass can start layer by layer.

With `step_frames=True` (what geryon.launch uses) every worker also sends one STEP frame per
iteration (float64: gradient clipping request, every group's numeric hyper-parameters as the
user's optimizer holds them at step(), and which tensors had a gradient), and the server applies
iteration i only once every worker's STEP for i arrived and agrees: a learning-rate schedule or a
manual change reaches every shard before its next update, a tensor no worker had a gradient for is
skipped as torch.optim skips it, and clipping by the global norm scales the averaged gradient by
the norm of the whole averaged gradient (partial sums of every server, `norm_exchange`).
Without STEP frames the settings stay those of the spec and every tensor is updated.

A worker may send its STEP frame and its pull of i + 1 before it pushes anything of iteration i
(--ps-pull ahead, geryon.runtime.ps_sync): the server then updates each shard as soon as its last push
arrives and answers the pull at once, so parameters come back while the workers' backward pass still
runs. Presence is then told per shard: an ABSENT control frame (payload: the shard's offset) stands
for a zero push, and a shard every worker marked ABSENT is left as it is.

Workers must not start pushing iteration i + 1 before their pull of i + 1 completed (the server
sends parameter slices from its live tensors without copying).
"""

from __future__ import annotations

from geryon.transport.buckets import normalize_priorities
from geryon.transport.config import TransportConfig
from geryon.transport.shards import Shard, ParamSpec, param_specs, plan_shards, shard_digest


def shard_layout(params, priorities, config: TransportConfig, servers: int,
                 workers: int) -> tuple[list[ParamSpec], list[Shard], bytes]:
    """(tensor specs, shard plan, plan digest) of `params`: the same on every server and worker."""
    specs = param_specs(params, normalize_priorities(len(params), priorities, config.classes))
    plan = plan_shards(specs, servers, config.scheduling, config.slice_bytes, config.placement)
    return specs, plan, shard_digest(specs, plan, servers, workers)
