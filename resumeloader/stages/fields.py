"""How a stage declares its configuration: each field checked on construction, order fields once.

A stage is a frozen dataclass (``@dataclasses.dataclass(frozen=True)``) whose fields
carry `meta` in their metadata: ``check`` turns the argument into the value kept (or
raises the house-style error naming it), and ``order`` marks a field that changes which
bytes land at which position, with how the state writes it. The base `Stage` runs every
check in ``__post_init__`` and derives `Stage.order_fields` from the marks, so a builder
method (``Pipeline.batch``) and ``Pipeline.apply(FixedBatchStage(...))`` refuse the same
arguments with the same message. Pure Python.

Example of a field: ``window: int = dataclasses.field(kw_only=True,
metadata=fields.meta(check=fields.count, order=True))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from resumeloader.core import validate

__all__ = ["count", "flag", "lengths", "meta", "optional", "text"]

#: ``check(name, value) -> value kept``; raises naming `name`.
Check = Callable[[str, Any], Any]
#: ``encode(value) -> the order field's int or str``.
Encode = Callable[[Any], "int | str"]


def meta(*, check: Check | None = None, order: Encode | bool = False) -> dict[str, Any]:
    """The metadata of a stage's dataclass field: checked on construction by `check`, an
    order field (written by `order`, or as an int / str when True) when `order` is set."""
    metadata: dict[str, Any] = {}
    if check is not None:
        metadata["check"] = check
    if order:
        metadata["order"] = plain if order is True else order
    return metadata


def plain(value: Any) -> int | str:
    """An order field's value as the state writes it: a bool as 0 or 1."""
    return int(value) if isinstance(value, bool) else value


def count(name: str, value: Any) -> int:
    """A count in [1, 2**62] (a Python or NumPy integer, not a bool)."""
    validate.check_type(name, value, validate.Int)
    return validate.integer(name, value, low=1, high=validate.MAX_COUNT)


def flag(name: str, value: Any) -> bool:
    """A Python or NumPy bool."""
    return validate.boolean(name, value)


def optional(check: Check) -> Check:
    """`check`, with None allowed."""
    return lambda name, value: None if value is None else check(name, value)


def lengths(*, none: bool) -> Check:
    """A check of a length, or of a mapping of a dict record's keys to lengths (None
    allowed, at the top or for a key, when `none`)."""

    def check(name: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: check(f"{name}[{k!r}]", v) for k, v in value.items()}
        if value is None and none:
            return None
        return count(name, value)

    return check


def text(default: str) -> Encode:
    """Writes a setting as an order field: `default` for None, ``key:value,...`` for a
    mapping, else ``str(value)``."""

    def encode(value: Any) -> str:
        if value is None:
            return default
        if isinstance(value, Mapping):
            return ",".join(f"{k}:{encode(value[k])}" for k in sorted(value, key=str))
        return str(value)

    return encode
