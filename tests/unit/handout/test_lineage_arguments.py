"""The arguments of the lineage lookups (`records_at`, `batch_at`): any integer type,
NumPy's included, and a `TypeError` naming the argument for anything else. No TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader import Pipeline
from resumeloader.handout import lineage
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce


def _lookup(**kwargs) -> list[lineage.BatchRecords]:
    plan = Plan(Pipeline(np.arange(20), seed=3).shuffle().batch(4), num_epochs=2)
    return lineage.records_at(plan, produce.BatchProducer(plan.pipeline), **kwargs)


@pytest.mark.parametrize(
    "steps",
    [3, np.int64(3), np.uint8(3), np.int32(3), [np.int64(3)], np.array([3]), range(3, 4)],
    ids=["int", "int64", "uint8", "int32", "list-of-int64", "array", "range"],
)
def test_records_at_any_integer_type_gives_the_same_batch(steps):
    """A step of any integer type (Python or NumPy, alone or in a sequence) is step 3."""
    assert _lookup(steps=steps, positions=None) == _lookup(steps=[3], positions=None)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(1.5, "float"), ("3", "str"), (True, "bool"), (np.float64(2.0), "float64"),
     ([1, 2.5], "float"), (None, "NoneType")],
    ids=["float", "str", "bool", "numpy-float", "list-with-float", "none-in-list"],
)
def test_records_at_non_integer_raises_type_error_naming_the_argument(value, type_name):
    """Anything but integers is refused, naming the argument and what it accepts."""
    positions = [value] if value is None else value
    with pytest.raises(TypeError) as info:
        _lookup(steps=None, positions=positions)
    message = str(info.value)
    assert message.startswith("`positions` must be a non-negative integer (Python or NumPy)")
    assert f"of type {type_name}" in message


def test_records_at_negative_step_raises_value_error():
    """A negative step is a value out of range, not a type error."""
    with pytest.raises(ValueError, match="`steps` must be a non-negative integer"):
        _lookup(steps=np.int64(-1), positions=None)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [(np.int64(7), None, None), (7, None, None),
     (1.5, TypeError, r"`step` must be a non-negative integer \(Python or NumPy\). "
                      r"Received: step=1.5 of type float."),
     ("7", TypeError, "`step` must be .* of type str"),
     (-2, ValueError, "`step`")],
    ids=["int64", "int", "float", "str", "negative"],
)
def test_number_accepts_integers_of_any_type_and_names_the_argument(value, error, match):
    """`lineage.number` (what `batch_at` checks its step and position with)."""
    if error is None:
        assert lineage.number("step", value) == 7
        assert type(lineage.number("step", value)) is int
    else:
        with pytest.raises(error, match=match):
            lineage.number("step", value)
