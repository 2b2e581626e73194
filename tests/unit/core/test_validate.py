"""`validate.number`: the real-number check behind `Tuning`'s and `ErrorPolicy`'s fields."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader.core import validate


@pytest.mark.parametrize(
    ("value", "kwargs", "expected"),
    [(0, {"low": 0, "high": 1}, 0.0), (1, {"low": 0, "high": 1}, 1.0),
     (np.float32(0.5), {"low": 0, "high": 1, "low_open": True}, 0.5),
     (1e9, {"low": 0}, 1e9)],
    ids=["low", "high", "numpy-open", "no-high"],
)
def test_number_accepts_bounds_and_returns_a_float(value, kwargs, expected):
    got = validate.number("x", value, **kwargs)
    assert got == expected and type(got) is float


@pytest.mark.parametrize(
    ("value", "kwargs", "error", "message"),
    [(0, {"low": 0, "high": 1, "low_open": True}, ValueError,
      "`x` must be a number in (0, 1]. Received: x=0."),
     (1.5, {"low": 0, "high": 1}, ValueError, "`x` must be a number in [0, 1]. Received: x=1.5."),
     (-1, {"low": 0, "unit": " of seconds"}, ValueError,
      "`x` must be a number of seconds >= 0. Received: x=-1."),
     (float("nan"), {"low": 0}, ValueError, "Received: x=nan."),
     (True, {"low": 0}, TypeError, "Received: x=True of type bool."),
     ("1", {"low": 0, "high": 1}, TypeError,
      "`x` must be a number in [0, 1]. Received: x='1' of type str.")],
    ids=["open-low", "over-high", "unit", "nan", "bool", "str"],
)
def test_number_refuses_naming_the_field_its_bounds_and_the_value(value, kwargs, error, message):
    with pytest.raises(error) as info:
        validate.number("x", value, **kwargs)
    assert message in str(info.value)
