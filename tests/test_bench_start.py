"""The benches' common start: every rank gets one instant (the latest arrival + the lead), sleeps until it and
is timed from it."""

import threading
import time

import pytest
import torch

from geryon.bench.paper_math import ProcStat, cpu_share, read_proc_stat
from geryon.bench.transport_roles import START_LEAD_S, machine_seconds, start_together, time_collectives


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


def test_no_rank_goes_on_after_a_timed_collective_before_every_rank_has_ended_it():
    """After each timed run (the last one included) the barrier comes before anything else a rank does:
    a rank that went on to its checks, refill or teardown at once would take a shared core from peers
    still receiving their last pieces."""
    log = []

    def small_allreduce(tensor):
        log.append("barrier" if tensor.numel() == 1 else "start")
        return tensor

    work, source = [torch.zeros(4)], [torch.ones(4)]
    time_collectives(1, 2, 2, small_allreduce, lambda: log.append("collective"), work, source,
                     after_each=lambda i: log.append(f"after {i}"))
    assert log == ["barrier", "start", "collective", "barrier", "after 0",
                   "barrier", "start", "collective", "barrier", "after 1"]


def test_machine_seconds_count_a_busy_loop():
    """The machine-wide CPU the allreduce rows report (machine_cpu_s_per_gb) rises by at least what this
    process burns; /proc/stat counts in ticks of 1/SC_CLK_TCK s, so allow two of them."""
    before, cpu_before = machine_seconds(), time.process_time()
    while time.process_time() - cpu_before < 0.3:
        pass
    burned = time.process_time() - cpu_before
    after = machine_seconds()
    assert after.busy - before.busy >= burned - 0.02
    assert after.steal >= before.steal >= 0


def test_steal_is_kept_out_of_busy(tmp_path):
    """/proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice (guest time
    is already inside user and nice). Steal is another guest's work, so it is in the total, not busy."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 10 50 800 20 5 15 40 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n")
    before = read_proc_stat(str(stat))
    assert before == ProcStat(busy=180.0, total=1040.0, steal=40.0)
    stat.write_text("cpu  200 10 50 840 20 5 15 100 7 0\n")
    after = read_proc_stat(str(stat))
    assert cpu_share(before, after) == pytest.approx(100 / 200)
    assert cpu_share(before, after, "steal") == pytest.approx(60 / 200)
    stat.write_text("cpu  1 2 3 4\n")             # an old kernel's four fields
    assert read_proc_stat(str(stat)) == ProcStat(busy=6.0, total=10.0, steal=0.0)


def test_only_rank_zero_reports_the_machine_cpu_of_its_timed_collectives():
    def alone(tensor):             # each rank alone: its own slot is the latest arrival, the sum its tensor
        return tensor

    work, source = [torch.zeros(4)], [torch.ones(4)]
    for rank in (0, 1):
        timed = time_collectives(rank, 2, 2, alone, lambda: time.sleep(0.01), work, source)
        assert len(timed.times) == len(timed.starts) == 2 and timed.cpu >= 0
        assert (timed.machine_cpu is None) == (timed.steal is None) == (rank != 0)
        record = timed.record()
        if rank == 0:
            assert timed.machine_cpu >= 0 and len(timed.steal) == 2 and min(timed.steal) >= 0
            assert record["machine_cpu_seconds"] == timed.machine_cpu and record["all_steal_seconds"] == timed.steal
        else:
            assert "machine_cpu_seconds" not in record and "all_steal_seconds" not in record
        assert record["all_seconds"] == timed.times and record["all_starts"] == timed.starts
        # every rank: user CPU and context switches (each run sleeps, so each switches at least once)
        assert record["user_cpu_seconds"] == timed.user_cpu >= 0 and record["context_switches"] == timed.switches >= 2
