"""Allreduce mode inside a worker: DDP's gradient buckets travel over geryon's priority flows.

The user keeps `DistributedDataParallel`; `attach_geryon_hook(ddp, job)` registers a communication
hook (geryon.transport.hooks.geryon_ddp_hook) that averages each bucket with geryon's ring allreduce
(`AllreduceGroup`), on the flow of the bucket's priority class. Ranks find each other through the
job's store (`hooks.peers_from_store`), each listening on the address the launcher gave it.

A bucket's class is the most urgent class among its parameters (DDP decides what shares a bucket),
its urgency the smallest urgency among them. Classes come from the urgency ranking, which needs a
sample input: a forward pre-hook on the wrapped module ranks on the first forward call and checks
that every rank made the same class assignment (geryon.runtime.priorities); until then (and if DDP
ever calls the hook before a forward) buckets are class 0.

With --priority search (geryon.runtime.search_sync) the classes change while training: an optimizer
step post-hook times each iteration and, when the search moves to another threshold, swaps the
per-parameter lookup before the next backward (DDP has waited for every bucket of the last one
before the step), so every rank sends the next iteration's buckets under the new classes. The new
assignment's digest is checked against every rank through the store first.

With --collectives nccl, nccl-ib:SL,... or gloo-classes (geryon.collectives) the same classes and the
same ranking or search decide each bucket's class, but the hook hands the bucket to its class's own
torch.distributed process group instead (geryon.runtime.class_groups); after the first iteration
that carried buckets, every rank checks that each group carried the same buckets in the same order.
"""

import atexit
import logging

from geryon.collectives import parse_collectives
from geryon.errors import ConfigError
from geryon.runtime import jobtransport
from geryon.runtime.priorities import decide_priorities, search_plan, tensor_priorities

log = logging.getLogger(__name__)


class BucketPriorities:
    """bucket -> (class, urgency), from the classes of the parameters DDP put in it."""

    def __init__(self):
        self.of_param: dict[int, tuple[int, int]] = {}

    def set_tensor_priorities(self, params, priorities) -> None:
        self.of_param = {id(p): prio for p, prio in zip(params, priorities)}

    def of_bucket(self, bucket) -> tuple[int, int]:
        found = [self.of_param[id(p)] for p in bucket.parameters() if id(p) in self.of_param]
        if not found:
            return (0, bucket.index())
        return (min(c for c, _ in found), min(u for _, u in found))


def attach_geryon_hook(ddp, job, timeline=None, optimizer=None):
    """Register geryon's comm hook on `ddp`; returns what carries the buckets (closed at exit).

    `job` is the rank's RankEnv; `optimizer` (needed by --priority search) is hooked to time
    iterations and switch classes. With geryon's transport (the default) the carrier is an
    AllreduceGroup, with per-class process groups (--collectives) a ClassGroups.
    """
    collectives = parse_collectives(job.collectives)
    if collectives.process_groups:
        return _attach_class_groups(ddp, job, collectives, optimizer)
    from geryon.transport.hooks import GeryonHookState, geryon_ddp_hook

    config = jobtransport.transport_config(job, tracer=timeline.transfer if timeline else None)
    store = jobtransport.open_store(job)
    group = jobtransport.open_allreduce_group(job, config, store)
    atexit.register(group.close)
    priorities = BucketPriorities()
    current = {}

    def hook(state, bucket):
        current[bucket.index()] = priorities.of_bucket(bucket)
        return geryon_ddp_hook(state, bucket)

    _register(ddp, GeryonHookState(group, lambda index: current[index]), hook, group.close)
    _rank_on_first_forward(ddp, job, store, config.classes, config.policy, priorities, optimizer)
    return group


def _attach_class_groups(ddp, job, collectives, optimizer):
    """--collectives nccl | nccl-ib | gloo-classes: each bucket to its class's process group."""
    from geryon.collectives import check_class_count
    from geryon.runtime.class_groups import ClassGroups
    from geryon.transport.config import DEFAULT_DSCP

    dscps = jobtransport.class_dscp(job.classes) or DEFAULT_DSCP
    check_class_count(collectives, len(dscps))
    if collectives.backend == "nccl" and any(not p.is_cuda for p in ddp.module.parameters()):
        raise ConfigError(f"--collectives {collectives.text()} reduces CUDA tensors, but the model has "
                          "parameters on the CPU: move it to this rank's GPU (e.g. "
                          "model.to(f'cuda:{ctx.local_rank}')) before geryon.distribute(), or use "
                          "--collectives gloo-classes")
    store = jobtransport.open_store(job)
    groups = ClassGroups(collectives, dscps, job.world_size)
    if job.is_main:
        print(f"geryon: buckets go through {groups.describe()}", flush=True)
    priorities = BucketPriorities()

    def hook(state, bucket):
        priority_class, _urgency = priorities.of_bucket(bucket)
        return state.allreduce(priority_class, bucket)

    _register(ddp, groups, hook, None)
    checked = {"done": False}

    def check_order_once(_module, _args, _kwargs):
        # the first forward after buckets travelled: every rank's first iteration has ended
        if not checked["done"] and groups.log.total:
            checked["done"] = True
            groups.check_order(store, f"{job.store_prefix}class_groups/order", job.rank)
        return None

    ddp.module.register_forward_pre_hook(check_order_once, with_kwargs=True)
    _rank_on_first_forward(ddp, job, store, len(dscps), job.policy, priorities, optimizer)
    return groups


def _register(ddp, state, hook, close) -> None:
    try:
        ddp.register_comm_hook(state, hook)
    except RuntimeError as exc:  # DDP allows one hook: the user's model already had its own
        if close is not None:
            close()
        raise ConfigError("this DistributedDataParallel already has a communication hook; under "
                          "geryon.launch geryon registers its own (which carries the buckets over its "
                          f"priority flows): remove yours, or run the script under torchrun ({exc})") from None


def _rank_on_first_forward(ddp, job, store, classes: int, policy: str, priorities: BucketPriorities,
                           optimizer) -> None:
    """Decide the classes on the first forward (and, with --priority search, switch them after steps)."""
    module = ddp.module
    params = list(module.parameters())
    ranking = {"done": False, "busy": False, "search": None}
    searching = job.priority == "search"
    prefix = job.store_prefix
    if searching and optimizer is None:
        raise ConfigError("--priority search in allreduce mode needs the optimizer: "
                          "use geryon.distribute(model, optimizer)")

    def first_forward(_module, args, kwargs):
        if ranking["done"] or ranking["busy"]:
            return None
        ranking["busy"] = True
        try:
            if searching:
                search, prios, how = search_plan(module, args, kwargs, classes, store, prefix, job,
                                                 {"mode": "allreduce", "policy": policy})
                ranking["search"], assignment = search, search.assignment
            else:
                assignment, prios, how = decide_priorities(module, args, kwargs, job.priority,
                                                           classes, store, prefix, job.rank,
                                                           job.world_size)
            priorities.set_tensor_priorities(params, prios)
            log.info("geryon: %s classes by %s: %s bytes per class", assignment.method, how,
                     assignment.bytes_per_class())
        finally:
            ranking["busy"] = False
            ranking["done"] = True
        return None

    def step_done(_optimizer, _args, _kwargs):
        search = ranking["search"]
        if search is None:
            return
        switched = search.iteration_done()
        if switched is not None:
            priorities.set_tensor_priorities(params, tensor_priorities(module, switched))

    module.register_forward_pre_hook(first_forward, with_kwargs=True, prepend=True)
    if searching:
        optimizer.register_step_post_hook(step_done)
