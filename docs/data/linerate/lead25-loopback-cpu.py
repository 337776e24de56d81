"""CPU per GB of geryon's ring allreduce on loopback, where the CPU, not a wire, is the limit.

    python docs/data/linerate/lead25-loopback-cpu.py WORLD SIZE_BYTES ITERS

WORLD processes (fork) on 127.0.0.1, one untimed allreduce, then ITERS timed ones of SIZE_BYTES float32,
cut into fixed 256 KiB pieces (the piece size the 100 Mbit/s rows use). Prints one JSON line: user and
system CPU seconds per GB put on the wire, summed over the ranks (os.times, every thread), the slowest
rank's wall seconds, and the pieces each rank sends. No wire is emulated and nothing is shaped, so the
user-space figure is the transport's own per-piece work (the interpreter and numpy) with little else.
"""

import json
import multiprocessing
import os
import sys
import time

import torch

PIECE = 256 * 1024


def rank_main(rank: int, world: int, first_port: int, size: int, iters: int, results) -> None:
    from geryon.transport.allreduce import AllreduceGroup
    from geryon.transport.config import TransportConfig
    torch.set_num_threads(1)
    config = TransportConfig(slice_bytes=PIECE, max_slice_bytes=PIECE, timeout=60, secret=b"loopback-cpu-0123456789")
    peers = [("127.0.0.1", first_port + i) for i in range(world)]
    with AllreduceGroup(rank, world, peers, config, listen=peers[rank]) as group:
        tensor = torch.randn(size // 4)
        group.allreduce([tensor.clone()])
        group.allreduce([torch.zeros(1)])
        before, started = os.times(), time.time()
        for _ in range(iters):
            group.allreduce([tensor])
        after, ended = os.times(), time.time()
        group.allreduce([torch.zeros(1)])
    results.put((after.user - before.user, after.system - before.system, ended - started))


def main() -> None:
    world, size, iters = int(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3])
    first_port = 29000 + (os.getpid() % 500) * 8
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [context.Process(target=rank_main, args=(r, world, first_port, size, iters, results))
             for r in range(world)]
    for process in ranks:
        process.start()
    measured = [results.get() for _ in ranks]
    for process in ranks:
        process.join()
    gb = 2 * (world - 1) * size * iters / 1e9
    print(json.dumps({"world": world, "size": size, "iters": iters,
                      "user_s_per_gb": round(sum(m[0] for m in measured) / gb, 4),
                      "sys_s_per_gb": round(sum(m[1] for m in measured) / gb, 4),
                      "wall_s": round(max(m[2] for m in measured), 3),
                      "pieces_per_rank": 2 * (world - 1) * size * iters / world / PIECE}))


if __name__ == "__main__":
    main()
