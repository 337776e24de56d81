"""The ns-3 reference of the fluid model: the fluid side always, ns-3 when the extra is installed."""

import importlib.util

import pytest

from geryon.sim.ns3ref import compare_phase, fluid_phase


def test_fluid_phase_known_times():
    # 4 hosts at 100 Mbit/s: each host sends 3 x 64 KiB high and 3 x 256 KiB low, 1448 payload
    # bytes in every 1502 the point-to-point link counts
    payload = 12.5e6 * 1448 / 1502
    prio = fluid_phase(4, 100e6, 64 * 1024, 256 * 1024, priority=True)
    assert prio["high_s"] == pytest.approx(3 * 64 * 1024 / payload)
    assert prio["all_s"] == pytest.approx(3 * 320 * 1024 / payload)
    fair = fluid_phase(4, 100e6, 64 * 1024, 256 * 1024, priority=False)
    assert fair["high_s"] == pytest.approx(2 * prio["high_s"])   # fair share with the bulk
    assert fair["all_s"] == pytest.approx(prio["all_s"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ns") is None,
                    reason="ns-3 not installed (pip install 'geryon[ns3]')")
def test_ns3_reference_runs_and_priority_helps_the_high_class():
    geryon = compare_phase(4, 100e6, 64 * 1024, 256 * 1024, priority=True)
    endhost = compare_phase(4, 100e6, 64 * 1024, 256 * 1024, priority=False)
    assert geryon["ns3"]["high_s"] < endhost["ns3"]["high_s"]
    assert geryon["ns3"]["all_s"] >= geryon["fluid"]["all_s"]   # packets cost headers and slow start
