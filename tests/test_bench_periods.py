"""The PS bench's iteration period: from the last worker's end of one iteration to the last worker's
end of the next, never longer than the slowest worker's own duration (which also counts the skew)."""

import pytest

from geryon.bench.transport import _coflow_periods, _iteration_seconds


def _result(started, ends):
    durations = [b - a for a, b in zip([started] + ends, ends)]
    return [{"event": "result", "started": started, "all_ends": ends, "all_seconds": durations}]


def test_period_runs_from_last_end_to_last_end():
    records = [_result(0.0, [4.0, 8.1, 12.0]), _result(0.2, [4.2, 8.0, 12.1])]
    assert _coflow_periods(records) == pytest.approx([4.0, 3.9, 4.0])


def test_an_early_finisher_carries_the_skew_the_period_does_not():
    # worker 0 finishes iteration 1 half a second early, then waits for worker 1's pushes
    records = [_result(0.0, [3.5, 7.6]), _result(0.0, [4.0, 7.6])]
    assert _coflow_periods(records) == pytest.approx([4.0, 3.6])
    assert _iteration_seconds(records) == pytest.approx([4.0, 4.1])
    assert all(p <= w for p, w in zip(_coflow_periods(records), _iteration_seconds(records)))
