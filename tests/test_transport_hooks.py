"""The DDP comm hook averages gradients like DDP's default; TCPStore rendezvous works."""

import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from geryon.transport.allreduce import AllreduceGroup
from geryon.transport.config import TransportConfig
from geryon.transport.hooks import GeryonHookState, geryon_ddp_hook, peers_from_store
from ports import free_port


def _free_port():
    return free_port()


def test_ddp_hook_with_store_rendezvous():
    world = 2
    config = TransportConfig(secret="t", timeout=20)
    # port 0: the store picks a free port itself, so no other process can take it in between
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=20))  # the master store must stay alive while ranks use it
    master = store.port
    results = [None] * world

    class FakeBucket:   # the two methods of dist.GradBucket the hook uses
        def __init__(self, buffer):
            self._buffer = buffer

        def buffer(self):
            return self._buffer

        def index(self):
            return 0

    def run(rank):
        client = dist.TCPStore("127.0.0.1", master, world, is_master=False, timeout=timedelta(seconds=20))
        peers = peers_from_store(client, rank, world, "127.0.0.1", _free_port())
        with AllreduceGroup(rank, world, peers, config, listen=peers[rank]) as group:
            future = geryon_ddp_hook(GeryonHookState(group), FakeBucket(torch.full((1000,), float(rank))))
            results[rank] = future.wait()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for result in results:
        assert torch.equal(result, torch.full((1000,), 0.5))
