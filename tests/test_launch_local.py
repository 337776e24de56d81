"""Training through the local backend equals single-process training on the same global batch."""

import pytest

from launch_support import EXAMPLE, EXAMPLE_ARGS, json_records, loss_curve, rank_lines, run_launcher


@pytest.mark.parametrize("mode_args", [["--mode", "allreduce"], ["--mode", "ps", "--servers", "1"]],
                         ids=["allreduce", "ps"])
@pytest.mark.slow
def test_two_workers_follow_the_single_process_curve(single_curve, mode_args):
    result = run_launcher("--local", "--workers", "2", *mode_args, EXAMPLE, *EXAMPLE_ARGS)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json_records(rank_lines(result.stdout, "worker0"))
    assert records[-1]["workers"] == 2 and records[-1]["mode"] == mode_args[1]
    assert loss_curve(records) == pytest.approx(single_curve, rel=1e-4, abs=1e-5)
    assert not rank_lines(result.stdout, "worker1")  # only rank 0 reports
    if mode_args[1] == "ps":  # the server ran geryon's ParameterServer
        assert any("serving" in line for line in rank_lines(result.stdout, "server0"))
