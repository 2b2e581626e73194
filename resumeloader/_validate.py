"""Argument checks shared by the public constructors.

Each check raises with one message naming the argument, what was received and
what was expected; types are checked with typeguard so that the annotations and
the runtime checks cannot drift apart.
"""

from __future__ import annotations

import numbers
from typing import Any

import typeguard

MAX_SEED = 2**64 - 1
MAX_COUNT = 2**62


def check_type(name: str, value: Any, expected: Any) -> None:
    """Raises a `TypeError` naming `name` when `value` is not of type `expected`."""
    try:
        typeguard.check_type(value, expected)
    except typeguard.TypeCheckError as err:
        msg = (
            f"`{name}` must be of type {_type_name(expected)}. "
            f"Received: {name}={value!r} of type {type(value).__name__}."
        )
        raise TypeError(msg) from err


def _type_name(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected).replace("typing.", "")


def is_integer(value: Any) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """Returns `value` as an `int` after checking `low <= value <= high`."""
    if not is_integer(value):
        msg = (
            f"`{name}` must be an integer. "
            f"Received: {name}={value!r} of type {type(value).__name__}."
        )
        raise TypeError(msg)
    value = int(value)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        msg = f"`{name}` must be an integer {bounds}. Received: {name}={value!r}."
        raise ValueError(msg)
    return value


def seed(value: Any) -> int:
    """Checks a seed: an integer in [0, 2**64)."""
    return integer("seed", value, low=0, high=MAX_SEED)


def boolean(name: str, value: Any) -> bool:
    """Checks a flag: a real `bool`, not a truthy object."""
    check_type(name, value, bool)
    return bool(value)


def shard(shard_index: Any, shard_count: Any) -> tuple[int, int]:
    """Checks `0 <= shard_index < shard_count`."""
    shard_count = integer("shard_count", shard_count, low=1, high=MAX_COUNT)
    shard_index = integer("shard_index", shard_index, low=0)
    if shard_index >= shard_count:
        msg = (
            "`shard_index` must be in [0, shard_count). "
            f"Received: shard_index={shard_index}, shard_count={shard_count}."
        )
        raise ValueError(msg)
    return shard_index, shard_count
