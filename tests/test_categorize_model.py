"""The analytic iteration-time model: the slides' recursion and the strict-priority link."""

import pytest

from geryon.categorize.model import IterationModel, Tensor, serve_strict_priority
from geryon.categorize.profiles import resolve_profile
from geryon.errors import ConfigError

BYTES_PER_SECOND_AT_8 = 8.0  # bandwidth 8 bit/s: one byte per second, easy arithmetic


def two_layer(sizes=(2, 3)):
    tensors = [Tensor(f"l{i}", i, s) for i, s in enumerate(sizes)]
    return IterationModel([1.0, 1.0], [2.0, 2.0], tensors, BYTES_PER_SECOND_AT_8)


def test_slides_recursion_by_hand():
    model = two_layer()
    # in order: t_p = [2, 5]; t_ff1 = 3, t_ff2 = max(3, 5) + 1 = 6; t_b2 = 8, t_b1 = 10;
    # t_bf2 = 8 + 3 = 11, t_bf1 = max(11, 10) + 2 = 13
    assert model.slides_iteration_time([0, 1]) == pytest.approx(13.0)
    # reverse: t_p = [5, 3]; t_ff1 = 6, t_ff2 = 7; t_b2 = 9, t_b1 = 11; t_bf2 = 12, t_bf1 = 14
    assert model.slides_iteration_time([1, 0]) == pytest.approx(14.0)
    with pytest.raises(ConfigError):
        model.slides_iteration_time([0, 0])


def test_strict_priority_link_preempts_and_keeps_fifo_within_a_class():
    # (ready, class, sequence, duration)
    jobs = [(0.0, 1, 0, 4.0), (1.0, 0, 1, 1.0), (1.5, 1, 2, 1.0)]
    assert serve_strict_priority(jobs) == pytest.approx([5.0, 2.0, 6.0])
    same_class = [(0.0, 0, 0, 4.0), (1.0, 0, 1, 1.0)]
    assert serve_strict_priority(same_class) == pytest.approx([4.0, 5.0])


def test_priority_model_by_hand():
    model = two_layer()
    # backward ends: layer 1 at 2, layer 0 at 4. One class: push l1 [2, 5], l0 [5, 7];
    # pull l1 [5, 8], l0 [8, 10]; forward l0 from 10 to 11, l1 to 12.
    assert model.priority_iteration_time([0, 0]) == pytest.approx(12.0)
    # layer 0 high: push l1 2..4 (pre-empted) ... l0 4..6, l1 resumes 6..7; pull l0 6..8,
    # l1 7 waits until 8 -> 8..11; forward l0 8(after backward 4)->9, l1 max(9, 11) + 1 = 12
    timeline = model.timeline([0, 1])
    assert timeline.push_end == pytest.approx((6.0, 7.0))
    assert timeline.pull_end == pytest.approx((8.0, 11.0))
    assert timeline.iteration_s == pytest.approx(12.0)


def test_priority_on_vgg19_beats_one_class_and_thresholds_0_and_1_are_equal():
    profile = resolve_profile("vgg19")
    model = IterationModel.from_profile(profile, 40e9)
    measure = model.threshold_measure(profile.ranking())
    assert measure(0.0) == measure(1.0)
    assert measure(0.8) < 0.9 * measure(0.0)
    assert measure(0.8) > model.compute_s()


def test_bad_model_inputs():
    with pytest.raises(ConfigError):
        IterationModel([1.0], [1.0, 2.0], [], 1e9)
    with pytest.raises(ConfigError):
        IterationModel([1.0], [1.0], [Tensor("x", 3, 4)], 1e9)
    with pytest.raises(ConfigError):
        IterationModel([1.0], [1.0], [], 0)
    with pytest.raises(ConfigError):
        two_layer().timeline([0])
