"""The benches' common start: every rank gets rank 0's instant, sleeps until it and is timed from it."""

import threading
import time

import torch

from geryon.bench.transport_roles import START_LEAD_S, start_together


def test_ranks_agree_on_rank_zeros_instant_and_wake_after_it():
    ranks = 3
    inputs: list[torch.Tensor] = [None] * ranks
    meeting = threading.Barrier(ranks)
    starts, woke = [None] * ranks, [None] * ranks

    def allreduce_of(rank):
        def allreduce(tensor):            # a sum over the ranks' tensors, as the ring and gloo compute it
            inputs[rank] = tensor.clone()
            meeting.wait()
            tensor.copy_(sum(inputs[1:], inputs[0]))
            meeting.wait()
        return allreduce

    def body(rank):
        starts[rank] = start_together(rank, allreduce_of(rank))
        woke[rank] = time.time()

    before = time.time()
    threads = [threading.Thread(target=body, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(starts)) == 1                       # one instant, exactly, on every rank
    assert before + START_LEAD_S <= starts[0] <= time.time()
    assert all(w >= starts[0] for w in woke)           # nobody starts the clock early
