"""Priority classes: coarse and threshold splits, serialisation, digest, bad input."""

import pytest

from geryon.categorize.classes import (Assignment, coarse_split, equal_thresholds, positions,
                                       threshold_split)
from geryon.categorize.profiles import resolve_profile
from geryon.categorize.urgency import RankedParameter, rank_parameters
from geryon.categorize.zoo import build_model
from geryon.errors import ClassSpecError, ConfigError


def ranking_of(sizes, types=None):
    types = types or ["Conv2d"] * len(sizes)
    return [RankedParameter(f"p{i}", f"l{i}", t, s // 4, s) for i, (s, t) in enumerate(zip(sizes, types))]


def test_coarse_split_conv_and_bn_high_fc_low():
    ranking = rank_parameters(*build_model("smallcnn"))
    assignment = coarse_split(ranking, max_classes=2)
    mapping = assignment.as_dict()
    assert {n for n, c in mapping.items() if c == 0} == {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                                                           "conv2.weight", "conv2.bias", "bn2.weight", "bn2.bias"}
    assert mapping["fc1.weight"] == 1 and mapping["fc2.bias"] == 1
    assert assignment.bytes_per_class()[1] > 10 * assignment.bytes_per_class()[0]


def test_coarse_split_on_profiles():
    vgg = coarse_split(resolve_profile("vgg19").ranking())
    assert vgg.tensors_per_class() == [16, 3]
    resnet = coarse_split(resolve_profile("resnet50").ranking())
    assert resnet.tensors_per_class() == [106, 1]
    share = resnet.bytes_per_class()[1] / sum(resnet.bytes_per_class())
    assert share == pytest.approx(0.08, abs=0.002)  # the slides' 8.02%


def test_threshold_split_by_position_two_and_three_classes():
    ranking = ranking_of([100] * 10)
    assert threshold_split(ranking, [0.4]).class_of == (0,) * 4 + (1,) * 6
    three = threshold_split(ranking, [0.4, 0.7])
    assert three.class_of == (0,) * 4 + (1,) * 3 + (2,) * 3 and three.classes == 3
    assert threshold_split(ranking, [0.0]).class_of == (1,) * 10   # t = 0: nothing urgent enough
    assert threshold_split(ranking, [1.0]).class_of == (0,) * 10   # t = 1: everything high
    four = threshold_split(ranking, equal_thresholds(4), max_classes=4)
    assert four.tensors_per_class() == [3, 2, 3, 2]


def test_threshold_split_by_bytes():
    ranking = ranking_of([10, 10, 80])
    assert positions(ranking, "bytes") == [0.0, 0.1, 0.2]
    assert threshold_split(ranking, [0.15], metric="bytes").class_of == (0, 0, 1)
    assert threshold_split(ranking, [0.15], metric="position").class_of == (0, 1, 1)


@pytest.mark.parametrize("thresholds", [[1.5], [-0.1], [0.7, 0.4], [0.4, 0.4], ["x"], [float("nan")]])
def test_bad_thresholds(thresholds):
    with pytest.raises(ClassSpecError):
        threshold_split(ranking_of([4, 4]), thresholds)


def test_more_classes_than_the_transport_has():
    with pytest.raises(ClassSpecError, match="only 2"):
        threshold_split(ranking_of([4, 4, 4]), [0.3, 0.6], max_classes=2)
    with pytest.raises(ClassSpecError, match="only 1"):
        coarse_split(ranking_of([4]), max_classes=1)
    with pytest.raises(ClassSpecError):
        threshold_split(ranking_of([4]), [0.5], metric="numel")
    assert issubclass(ClassSpecError, ConfigError)


def test_assignment_round_trip_and_digest():
    assignment = threshold_split(resolve_profile("resnet50").ranking(), [0.3, 0.8], max_classes=4)
    again = Assignment.from_json(assignment.to_json())
    assert again == assignment and again.digest() == assignment.digest()
    other = threshold_split(resolve_profile("resnet50").ranking(), [0.3, 0.81])
    assert other.digest() != assignment.digest()
    assert assignment["fc1000"] == 2
    with pytest.raises(ClassSpecError):
        Assignment.from_json("{}")
    with pytest.raises(ClassSpecError):
        Assignment.from_json("nope")
    bad = assignment.to_data()
    bad["parameters"][0]["class"] = 7
    with pytest.raises(ClassSpecError):
        Assignment.from_data(bad)
