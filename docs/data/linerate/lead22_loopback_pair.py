"""Shared by lead22-call-parts.py and lead22-call-to-first-send.py: two allreduce ranks as threads
over loopback, warmed up with one 10 MB allreduce, and a clock on rank 0's first piece queued."""
import socket
import threading
import time

import torch

from geryon.transport import flows
from geryon.transport.allreduce import AllreduceGroup
from geryon.transport.config import TransportConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def warm_pair() -> tuple[list[AllreduceGroup], list[torch.Tensor]]:
    """Two connected ranks that have reduced their 10 MB inputs once, and those inputs."""
    peers = [("127.0.0.1", _free_port()), ("127.0.0.1", _free_port())]
    groups = [None, None]
    config = TransportConfig(secret="lead22")
    threads = [threading.Thread(target=lambda r=r: groups.__setitem__(r, AllreduceGroup(r, 2, peers, config)))
               for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    inputs = [torch.randn(2_500_000) for _ in range(2)]
    other = threading.Thread(target=lambda: groups[1].allreduce([inputs[1].clone()]))
    other.start()
    groups[0].allreduce([inputs[0].clone()])
    other.join()
    return groups, inputs


def first_piece_clock(group: AllreduceGroup) -> list[float]:
    """A list that gets the perf_counter() of `group`'s first piece queued once cleared."""
    first_send: list[float] = []
    send = flows.Flow.send

    def timed_send(self, *args, **kwargs):
        if not first_send and self.pool is group.pool:
            first_send.append(time.perf_counter())
        return send(self, *args, **kwargs)

    flows.Flow.send = timed_send
    return first_send
