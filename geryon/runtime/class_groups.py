"""Per-class process groups (--collectives nccl | nccl-ib:SL,... | gloo-classes): each priority class's DDP
buckets are averaged in a torch.distributed group of its own.

Why a group per class: a process group runs its collectives in the order they were issued (NCCL: on
one CUDA stream per group and device; gloo: on its own work queue and connections). In one group an
urgent bucket waits behind every bulk bucket issued before it; with a group per class it waits only
for its own class. With NCCL >= 2.26 each group is also created with its own traffic class (the
class's DSCP << 2 on RoCE, a service level on InfiniBand: geryon.collectives), so the fabric's
priority queues (geryon's switch profiles) serve the urgent class first. gloo cannot mark packets.

Groups are made with `dist.new_group(ranks, backend, pg_options)`, never split from a parent: a
communicator split from a parent that shares its resources keeps the parent's traffic class (NCCL
says so only at INFO level), so a default group bound to a device (init_process_group(device_id=...),
the case in which PyTorch splits) is refused. The most urgent class's NCCL stream is created with high
CUDA priority, so its kernels are scheduled first when the GPU is busy. NCCL_IB_TC / NCCL_IB_SL, in
the environment or an NCCL configuration file, override every communicator's class inside NCCL:
`class_overrides` finds them and the groups' creation warns.

Order: every rank must issue each group's collectives in the same order (else NCCL hangs and gloo
may add up two different buckets of the same size), and, for NCCL communicators running at once,
all collectives in the same global order. DDP launches buckets in bucket-index order on every rank
and every rank maps buckets to classes alike (the assignment digest, geryon.runtime.priorities), so
both hold; `OrderLog` keeps a running digest of each group's sequence and `ClassGroups.check_order`
compares them through the job's store (geryon.runtime.ddp_sync does it after the first iteration).
"""

import hashlib
import json
import logging
import os
from pathlib import Path

from geryon.collectives import Collectives
from geryon.errors import CollectivesUnavailable, ProtocolError

log = logging.getLogger(__name__)

NCCL_MIN_VERSION = (2, 26)                  # ncclConfig_t.trafficClass
NCCL_OVERRIDES = ("NCCL_IB_TC", "NCCL_IB_SL")
USER_CONF_FILE = "~/.nccl.conf"        # NCCL reads NCCL_CONF_FILE instead, when set ...
SYSTEM_CONF_FILE = "/etc/nccl.conf"     # ... and this one always; the environment wins over both
TORCH_FEATURE = "ProcessGroupNCCL.Options().config.traffic_class (pytorch/pytorch#151821)"


def nccl_support_problem(torch_version: str, nccl_available: bool, nccl_config, nccl_version) -> str | None:
    """Why this PyTorch/NCCL cannot give a communicator its own traffic class; None when it can.

    PyTorch is checked by feature (the option exists), NCCL by the version the loaded library reports
    (the field lives in a C struct PyTorch copies).
    """
    if not nccl_available:
        return (f"PyTorch {torch_version} has no NCCL (a CPU build?): install a CUDA build of PyTorch "
                f"that has {TORCH_FEATURE}, with NCCL >= {'.'.join(map(str, NCCL_MIN_VERSION))}")
    if not hasattr(nccl_config, "traffic_class"):
        return (f"PyTorch {torch_version} cannot give an NCCL communicator its own traffic class (it lacks "
                f"{TORCH_FEATURE}): upgrade PyTorch to a release that has it")
    if tuple(nccl_version)[:2] < NCCL_MIN_VERSION:
        found = ".".join(map(str, nccl_version))
        return (f"NCCL {found} has no traffic class per communicator (ncclConfig_t.trafficClass needs "
                f"NCCL >= {'.'.join(map(str, NCCL_MIN_VERSION))}): install a newer NCCL (e.g. the "
                "nvidia-nccl wheel PyTorch loads)")
    return None


def nccl_version() -> tuple[int, ...]:
    """The loaded NCCL library's version, as (major, minor, patch)."""
    import torch

    version = torch.cuda.nccl.version()
    if isinstance(version, int):   # older PyTorch: NCCL_VERSION_CODE, major*10000 + minor*100 + patch
        return (version // 10000, version // 100 % 100, version % 100)
    return tuple(version)


def check_nccl_traffic_classes() -> None:
    """Raise CollectivesUnavailable unless NCCL groups can be created with their own traffic class."""
    import torch
    import torch.distributed as dist

    available = dist.is_available() and dist.is_nccl_available()
    config = dist.ProcessGroupNCCL.Options().config if available else None
    problem = nccl_support_problem(torch.__version__, available, config, nccl_version() if available else ())
    if problem:
        raise CollectivesUnavailable(f"--collectives nccl: {problem}; or use --collectives gloo-classes "
                                     "or geryon")


def class_overrides(environ=None, system_conf: str = SYSTEM_CONF_FILE) -> list[str]:
    """The NCCL settings that override every communicator's traffic class, each with where it was set."""
    env = os.environ if environ is None else environ
    found = [f"{name}={env[name]} (environment)" for name in NCCL_OVERRIDES if env.get(name, "").strip()]
    for file in (env.get("NCCL_CONF_FILE") or USER_CONF_FILE, system_conf):
        path = Path(file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, sep, value = line.strip().partition("=")
            if sep and name.strip() in NCCL_OVERRIDES and name.strip() not in env:
                found.append(f"{name.strip()}={value.strip()} ({path})")
    return found


def refuse_split_parent() -> None:
    """PyTorch splits a new NCCL group from a default group bound to a device; refuse that case."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group

    if dist.is_initialized() and getattr(_get_default_group(), "bound_device_id", None) is not None:
        raise CollectivesUnavailable(
            "--collectives nccl: the default process group is bound to a device (init_process_group("
            "device_id=...)), so PyTorch would split each class's NCCL group from it, and a split "
            "communicator sharing its parent's resources keeps the parent's traffic class; let "
            "geryon.init() set up torch.distributed, or call init_process_group without device_id")


class OrderLog:
    """A running digest of the buckets each group (and the whole job) carried, in order."""

    def __init__(self, groups: int):
        self._per_group = [hashlib.sha256() for _ in range(groups)]
        self._all = hashlib.sha256()
        self.counts = [0] * groups

    def note(self, group: int, bucket_index: int, buffer) -> None:
        entry = f"{group}:{bucket_index}:{buffer.numel()}:{buffer.dtype};".encode()
        self._per_group[group].update(entry)
        self._all.update(entry)
        self.counts[group] += 1

    @property
    def total(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> dict:
        """Counts and digests so far (JSON-ready)."""
        return {"counts": list(self.counts), "groups": [h.hexdigest() for h in self._per_group],
                "all": self._all.hexdigest()}


class ClassGroups:
    """One process group per priority class; `allreduce` averages a bucket in its class's group."""

    def __init__(self, collectives: Collectives, dscps: tuple[int, ...], world_size: int):
        import torch.distributed as dist

        self.collectives = collectives
        self.world_size = world_size
        self.traffic_classes = collectives.traffic_classes(tuple(dscps))
        if collectives.backend == "nccl":
            check_nccl_traffic_classes()
            refuse_split_parent()
            for override in class_overrides():
                log.warning("geryon: %s overrides the traffic class of every NCCL communicator, so all "
                            "classes' buckets leave with it; unset it to mark each class on its own", override)
        ranks = list(range(world_size))
        self.groups = [dist.new_group(ranks, backend=collectives.backend,
                                      pg_options=self._options(index, traffic))
                       for index, traffic in enumerate(self.traffic_classes)]
        self.log = OrderLog(len(self.groups))

    def _options(self, index: int, traffic_class: int | None):
        if self.collectives.backend != "nccl":
            return None
        import torch.distributed as dist

        options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=index == 0)
        options.config.traffic_class = traffic_class
        return options

    def describe(self) -> str:
        """One line: backend, and each class's traffic class."""
        marks = ", ".join(f"class {i}: {'unmarked' if t is None else f'traffic class {t}'}"
                          for i, t in enumerate(self.traffic_classes))
        return f"{self.collectives.text()}: {len(self.groups)} {self.collectives.backend} groups ({marks})"

    def group_of(self, priority_class: int) -> int:
        """The group index of a class (a class beyond the last goes with the last, as in the transport)."""
        return min(max(priority_class, 0), len(self.groups) - 1)

    def allreduce(self, priority_class: int, bucket):
        """Average a DDP GradBucket's buffer over the ranks in its class's group; a Future of the buffer."""
        import torch.distributed as dist

        group = self.group_of(priority_class)
        buffer = bucket.buffer()
        self.log.note(group, bucket.index(), buffer)
        buffer.div_(self.world_size)   # then sum: DDP's own default hook, bit-equal to it
        work = dist.all_reduce(buffer, group=self.groups[group], async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def check_order(self, store, key: str, rank: int) -> dict:
        """Compare this rank's OrderLog with every rank's through `store` (`check_order`)."""
        return check_order(store, key, rank, self.world_size, self.log.snapshot())


def check_order(store, key: str, rank: int, world_size: int, mine: dict) -> dict:
    """Publish this rank's OrderLog snapshot under `key`, read every rank's; ProtocolError if any differs."""
    store.set(f"{key}/{rank}", json.dumps(mine))
    theirs = {other: json.loads(store.get(f"{key}/{other}")) for other in range(world_size)}
    differ = sorted(other for other, snapshot in theirs.items() if snapshot != mine)
    if differ:
        raise ProtocolError(f"rank {rank} sent its buckets to the class groups in another order than "
                            f"ranks {differ} (buckets per class {mine['counts']} vs "
                            f"{theirs[differ[0]]['counts']}): every rank must build the same model, "
                            "with the same DDP options, and run the same iterations")
    return mine
