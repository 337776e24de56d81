"""The PS bench's iteration period: from the last worker's end of one iteration to the last worker's
end of the next, never longer than the slowest worker's own duration (which also counts the skew)."""

import pytest

from geryon.bench.transport_measure import coflow_periods, iteration_seconds


def _result(started, ends):
    durations = [b - a for a, b in zip([started] + ends, ends)]
    return [{"event": "result", "started": started, "all_ends": ends, "all_seconds": durations}]


def test_period_runs_from_last_end_to_last_end():
    records = [_result(0.0, [4.0, 8.1, 12.0]), _result(0.2, [4.2, 8.0, 12.1])]
    assert coflow_periods(records) == pytest.approx([4.0, 3.9, 4.0])


def test_an_early_finisher_carries_the_skew_the_period_does_not():
    # worker 0 finishes iteration 1 half a second early, then waits for worker 1's pushes
    records = [_result(0.0, [3.5, 7.6]), _result(0.0, [4.0, 7.6])]
    assert coflow_periods(records) == pytest.approx([4.0, 3.6])
    assert iteration_seconds(records) == pytest.approx([4.0, 4.1])
    assert all(p <= w for p, w in zip(coflow_periods(records), iteration_seconds(records)))


def test_launches_of_one_system_add_up_in_order():
    """--interleave gathers a system's collectives over several launches of its roles: times and rank 0's
    steal in launch order, TCP counters summed per host, every record kept for the CPU sums."""
    from geryon.bench.tcpstats import Counted
    from geryon.bench.transport_allreduce import Measured
    from geryon.bench.transport_measure import MACHINE, summed

    def launch(seconds, steal):
        rank0 = {"event": "result", "all_seconds": [seconds], "all_steal_seconds": [steal], "cpu_seconds": 1.0,
                 MACHINE: 2.0}
        rank1 = {"event": "result", "all_seconds": [seconds - 0.1], "cpu_seconds": 1.0}
        return [[rank0], [rank1]]

    measured = Measured()
    for seconds, steal, segs, softnet in ((5.0, 0.25, 10, 3), (4.0, 0.0, 7, 0)):
        measured.add(Counted(launch(seconds, steal), {"h1": {"out_segs": segs}, "h2": {"out_segs": 1}}, softnet))
    assert measured.times == [5.0, 4.0] and measured.steal == [0.25, 0.0]
    assert measured.tcp == {"h1": {"out_segs": 17}, "h2": {"out_segs": 2}} and measured.softnet_drops == 3
    assert summed(measured.records) == 4.0 and summed(measured.records, MACHINE) == 4.0
    unmeasured = Measured()
    unmeasured.add(Counted([[{"event": "result", "all_seconds": [1.0]}]], {}, 0))
    assert unmeasured.steal is None           # roles that report no steal: the row says null
