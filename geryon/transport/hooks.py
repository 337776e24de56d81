"""Glue for frameworks: a DDP communication hook over AllreduceGroup, and TCPStore rendezvous.

    group = AllreduceGroup(rank, world, peers_from_store(store, rank, world, my_ip, port), config)
    ddp_model.register_comm_hook(GeryonHookState(group, priority_of_bucket), geryon_ddp_hook)

`priority_of_bucket(bucket_index) -> int | (class, urgency)` maps DDP's bucket index to a class;
by default every bucket is class 0. The hook averages (op="avg"), like DDP's default. A CUDA
bucket crosses the flows through host staging (geryon.transport.staging) and its future is bound
to its device (`bucket_future`).
"""

import threading
from dataclasses import dataclass

import torch

from geryon.transport.allreduce import AllreduceGroup


@dataclass
class GeryonHookState:
    group: AllreduceGroup
    priority_of_bucket: object = None

    def __post_init__(self):
        self.lock = threading.Lock()   # DDP may call the hook from its reducer; keep calls ordered


def geryon_ddp_hook(state: GeryonHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: allreduce-average the bucket's flat buffer on the geryon flows.

    (No `from __future__ import annotations` in this module: DDP compares the return annotation
    with the real `torch.futures.Future[torch.Tensor]` and refuses a string.)
    """
    buffer = bucket.buffer()
    index = bucket.index()
    priority = state.priority_of_bucket(index) if state.priority_of_bucket else 0
    future: torch.futures.Future = bucket_future(buffer)
    with state.lock:   # every rank issues buckets in the same order
        work = state.group.allreduce_async([buffer], [priority], op="avg")

    def complete():
        try:
            work.wait()    # a CUDA bucket: this thread's current stream now follows the staging streams
            future.set_result(buffer)
        except BaseException as exc:  # noqa: BLE001
            future.set_exception(exc)

    threading.Thread(target=complete, name=f"gy-ddp-bucket-{index}", daemon=True).start()
    return future


def bucket_future(buffer: torch.Tensor) -> torch.futures.Future:
    """The future DDP waits on for `buffer`: for a CUDA bucket one bound to its device, as DDP's own
    hooks make, so `set_result` records an event on the completing thread's current stream and
    DDP's stream waits for that event (the host does not synchronise the device)."""
    if buffer.device.type == "cuda":
        return torch.futures.Future(devices=[buffer.device])
    return torch.futures.Future()


def peers_from_store(store, rank: int, world: int, host: str, port: int,
                     prefix: str = "geryon/transport") -> list[tuple[str, int]]:
    """Publish this rank's (host, port) in a torch.distributed Store and read everyone's."""
    store.set(f"{prefix}/{rank}", f"{host}:{port}")
    peers = []
    for other in range(world):
        value = store.get(f"{prefix}/{other}").decode()
        address, other_port = value.rsplit(":", 1)
        peers.append((address, int(other_port)))
    return peers
