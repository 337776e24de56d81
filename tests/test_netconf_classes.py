"""Priority classes: defaults, the --classes syntax, and clear errors for bad specs (no root needed)."""

import pytest

from geryon.errors import ClassSpecError, ConfigError
from geryon.netconf import MAX_CLASSES, PriorityClass, default_classes, format_classes, parse_classes


def test_two_default_classes_are_ef_and_best_effort():
    assert default_classes() == (PriorityClass("high", 46), PriorityClass("low", 0))
    assert parse_classes(None) == default_classes()
    assert default_classes()[0].tos == 0xB8


@pytest.mark.parametrize("count", range(1, MAX_CLASSES + 1))
def test_default_classes_are_distinct_and_ordered(count):
    classes = default_classes(count)
    dscps = [cls.dscp for cls in classes]
    assert len(classes) == count
    assert len(set(dscps)) == count and len({cls.name for cls in classes}) == count
    assert dscps[-1] == 0
    assert dscps == sorted(dscps, reverse=True)  # higher code points get higher priority
    if count >= 2:
        assert dscps[0] == 46


def test_spread_over_cs_af_values():
    assert [cls.dscp for cls in default_classes(4)] == [46, 34, 26, 0]
    assert [cls.dscp for cls in default_classes(8)] == [46, 40, 34, 26, 18, 10, 8, 0]


@pytest.mark.parametrize("spec, expected", [
    ("high:46,low:0", ((("high", 46), ("low", 0)))),
    (" gold : 46 , silver:26,bronze:0 ", (("gold", 46), ("silver", 26), ("bronze", 0))),
    ("46,26,0", (("high", 46), ("medium", 26), ("low", 0))),
    ("solo:0x2e", (("solo", 46),)),
    ([("a", 10), ("b", 0)], (("a", 10), ("b", 0))),
    ([PriorityClass("x", 1)], (("x", 1),)),
])
def test_parse_specs(spec, expected):
    assert parse_classes(spec) == tuple(PriorityClass(name, dscp) for name, dscp in expected)


def test_count_specs():
    assert parse_classes("3") == default_classes(3)
    assert parse_classes(4) == default_classes(4)


def test_format_round_trips():
    classes = default_classes(5)
    assert parse_classes(format_classes(classes)) == classes


@pytest.mark.parametrize("spec, message", [
    ("9", "between 1 and 8"),
    (",".join(f"c{i}:{i}" for i in range(9)), "between 1 and 8"),
    ("0", "between 1 and 8"),
    ("high:64,low:0", "outside 0-63"),
    ("high:-1,low:0", "outside 0-63"),
    ("high:46,low:46", "duplicate DSCP 46"),
    ("a:46,a:0", "duplicate class name 'a'"),
    ("high:ef,low:0", "bad DSCP 'ef'"),
    ("high:46,,low:0", "empty entry"),
    ("", "empty class spec"),
    ("9bad:1", "bad class name"),
])
def test_bad_specs_raise_clear_typed_errors(spec, message):
    with pytest.raises(ClassSpecError, match=message) as info:
        parse_classes(spec)
    assert isinstance(info.value, ConfigError)
