"""Argument checks shared by the public constructors and stage builders.

Each check raises with one message naming the argument, what was received and what
was expected. Types are checked with typeguard against the annotations themselves
(`typechecked`), so that the documented types and the runtime checks cannot drift
apart.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

MAX_SEED = 2**64 - 1
MAX_COUNT = 2**62

# What a count or a seed may be: Python or NumPy integers (never bools, see `integer`).
Int = int | np.integer

F = TypeVar("F", bound=Callable[..., Any])


def type_name(value_or_type: Any) -> str:
    """A type's name as a user reads it: ``int``, ``numpy.bool``, ``list[int]``."""
    kind = value_or_type if isinstance(value_or_type, type) else type(value_or_type)
    module = getattr(kind, "__module__", "builtins")
    name = getattr(kind, "__qualname__", str(kind))
    if module == "builtins":
        return name
    return f"{module.split('.')[0]}.{name}"


def _expected_name(expected: Any) -> str:
    if expected is Int:
        return "int"
    text = getattr(expected, "__name__", None) if isinstance(expected, type) else None
    return text or str(expected).replace("typing.", "").replace("collections.abc.", "")


def check_type(name: str, value: Any, expected: Any) -> None:
    """Raises a `TypeError` naming `name` when `value` is not of type `expected`."""
    # Imported on first use: a worker process, which checks no arguments, starts
    # without it (typeguard and the unittest.mock it imports: ~90 ms of a ~250 ms start).
    import typeguard

    try:
        typeguard.check_type(value, expected)
    except typeguard.TypeCheckError as err:
        msg = (
            f"`{name}` must be of type {_expected_name(expected)}. "
            f"Received: {name}={value!r:.200} of type {type_name(value)}."
        )
        raise TypeError(msg) from err
    if expected in (Int, int) and isinstance(value, (bool, np.bool_)):
        msg = f"`{name}` must be an integer, not a bool. Received: {name}={value!r}."
        raise TypeError(msg)


def typechecked(func: F) -> F:
    """Checks every annotated argument of `func` with `check_type` before calling it.

    Unlike ``typeguard.typechecked`` the error is a house-style `TypeError` that names
    the argument, the value received and the expected type.
    """
    signature = inspect.signature(func)
    checked: dict[str, Any] = {}

    def hints() -> dict[str, Any]:
        # Resolved at the first call: annotations may name classes defined later.
        if not checked:
            resolved = typing.get_type_hints(func)
            checked.update(
                (name, resolved[name])
                for name in signature.parameters
                if name in resolved and name not in ("self", "cls") and resolved[name] is not Any
            )
        return checked

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        expected = hints()
        for name, value in bound.arguments.items():
            if name in expected:
                check_type(name, value, expected[name])
        return func(*args, **kwargs)

    return typing.cast(F, wrapper)


def removed(what: str, **spellings: str) -> Callable[[F], F]:
    """Refuses each keyword of `spellings` given to `what` with a `TypeError` naming the
    spelling that replaces it (a keyword no release takes any more)."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            gone = [name for name in kwargs if name in spellings]
            if gone:
                given = ", ".join(f"{name}={kwargs[name]!r:.40}" for name in gone)
                instead = "; ".join(dict.fromkeys(spellings[name] for name in gone))
                msg = (
                    f"{what} takes no {', '.join(f'`{name}`' for name in gone)} any more: "
                    f"use {instead}. Received: {given}."
                )
                raise TypeError(msg)
            return func(*args, **kwargs)

        return typing.cast(F, wrapper)

    return decorate


def is_integer(value: Any) -> bool:
    """True for Python and NumPy integers, False for bools and everything else."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """Returns `value` as an `int` after checking `low <= value <= high`."""
    if not is_integer(value):
        msg = (
            f"`{name}` must be an integer. "
            f"Received: {name}={value!r:.200} of type {type_name(value)}."
        )
        raise TypeError(msg)
    value = int(value)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        msg = f"`{name}` must be an integer {bounds}. Received: {name}={value!r}."
        raise ValueError(msg)
    return value


def number(name: str, value: Any, *, low: float, high: float | None = None,
           low_open: bool = False, unit: str = "") -> float:
    """Returns `value` (a real number, not a bool) as a `float` after checking it is in
    [`low`, `high`] (`low` excluded with `low_open`; no upper bound when `high` is None).
    `unit` goes after "a number" in the message (e.g. ``" of seconds"``)."""
    opening = "(" if low_open else "["
    bounds = (f"{'>' if low_open else '>='} {low:g}" if high is None
              else f"in {opening}{low:g}, {high:g}]")
    expected = f"`{name}` must be a number{unit} {bounds}."
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        msg = f"{expected} Received: {name}={value!r:.80} of type {type_name(value)}."
        raise TypeError(msg)
    real = float(value)
    if not (real > low if low_open else real >= low) or (high is not None and real > high):
        msg = f"{expected} Received: {name}={value!r}."
        raise ValueError(msg)
    return real


def seed(value: Any) -> int:
    """Checks a seed: an integer in [0, 2**64)."""
    return integer("seed", value, low=0, high=MAX_SEED)


def boolean(name: str, value: Any) -> bool:
    """Checks a flag: a Python or NumPy bool, not a truthy object."""
    if isinstance(value, np.bool_):
        return bool(value)
    check_type(name, value, bool)
    return bool(value)


def shard(
    shard_index: Any, shard_count: Any, *, names: tuple[str, str] = ("shard_index", "shard_count")
) -> tuple[int, int]:
    """Checks `0 <= shard_index < shard_count` (named `names` in the errors)."""
    index_name, count_name = names
    shard_count = integer(count_name, shard_count, low=1, high=MAX_COUNT)
    shard_index = integer(index_name, shard_index, low=0)
    if shard_index >= shard_count:
        msg = (
            f"`{index_name}` must be in [0, {count_name}). "
            f"Received: {index_name}={shard_index}, {count_name}={shard_count}."
        )
        raise ValueError(msg)
    return shard_index, shard_count
