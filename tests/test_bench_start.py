"""The benches' common start: every rank gets one instant (the latest arrival + the lead), sleeps until it and
is timed from it."""

import threading
import time

import torch

from geryon.bench.transport_roles import START_LEAD_S, machine_busy_seconds, start_together, time_collectives


def test_ranks_agree_on_the_latest_arrival_plus_the_lead_and_wake_after_it():
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

    arrived = [None] * ranks

    def body(rank):
        time.sleep(0.05 * rank)                      # rank 2 arrives last, 0.1 s after rank 0
        arrived[rank] = time.time()
        starts[rank] = start_together(rank, ranks, allreduce_of(rank))
        woke[rank] = time.time()

    before = time.time()
    threads = [threading.Thread(target=body, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(starts)) == 1                       # one instant, exactly, on every rank
    assert before + START_LEAD_S <= starts[0] <= time.time()
    assert max(arrived) + START_LEAD_S - 0.01 <= starts[0] <= max(arrived) + START_LEAD_S + 0.01
    assert all(w >= starts[0] for w in woke)           # nobody starts the clock early


def test_inputs_are_refilled_in_place_only_after_the_barrier():
    from geryon.bench.transport_roles import refill_between
    source, work, seen = [torch.arange(4.0)], [torch.zeros(4)], []
    buffer = work[0].data_ptr()
    refill_between(lambda: seen.append(work[0].clone()), work, source)
    assert seen[0].eq(0).all()                          # the barrier ran before the copy
    assert work[0].equal(source[0]) and work[0].data_ptr() == buffer   # copied into the same buffer


def test_machine_busy_seconds_counts_a_busy_loop():
    """The machine-wide CPU the allreduce rows report (machine_cpu_s_per_gb) rises by at least what this
    process burns; /proc/stat counts in ticks of 1/SC_CLK_TCK s, so allow two of them."""
    before, cpu_before = machine_busy_seconds(), time.process_time()
    while time.process_time() - cpu_before < 0.3:
        pass
    burned = time.process_time() - cpu_before
    assert machine_busy_seconds() - before >= burned - 0.02


def test_only_rank_zero_reports_the_machine_cpu_of_its_timed_collectives():
    def alone(tensor):             # each rank alone: its own slot is the latest arrival, the sum its tensor
        return tensor

    work, source = [torch.zeros(4)], [torch.ones(4)]
    for rank in (0, 1):
        times, starts, cpu, machine = time_collectives(rank, 2, 2, alone, lambda: time.sleep(0.01), work, source)
        assert len(times) == len(starts) == 2 and cpu >= 0
        assert (machine is None) == (rank != 0)
        assert machine is None or machine >= 0
