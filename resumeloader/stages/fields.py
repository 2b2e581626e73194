"""How a stage declares its configuration: each field checked on construction, order fields once.

A stage is a frozen dataclass whose fields are declared with `field`: ``check`` turns
the argument into the value kept (or raises the house-style error naming it), and
``order`` marks a field that changes which bytes land at which position, with how it
is written in the state. The base `Stage` runs every check in ``__post_init__`` and
derives `Stage.order_fields` from the marks, so a builder method (``Pipeline.batch``)
and ``Pipeline.apply(FixedBatchStage(...))`` refuse the same arguments with the same
message. Pure Python.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from resumeloader.core import validate

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:
    from typing_extensions import dataclass_transform

__all__ = ["count", "field", "flag", "lengths", "optional", "stage", "text"]

T = TypeVar("T")

#: ``check(name, value) -> value kept``; raises naming `name`.
Check = Callable[[str, Any], Any]
#: ``encode(value) -> the order field's int or str``.
Encode = Callable[[Any], "int | str"]


def field(
    *,
    check: Check | None = None,
    order: Encode | bool = False,
    default: Any = dataclasses.MISSING,
    init: bool = True,
    kw_only: bool = False,
) -> Any:
    """A dataclass field of a stage: checked on construction by `check`, an order field
    (written by `order`, or as an int / str when True) when `order` is set."""
    metadata: dict[str, Any] = {}
    if check is not None:
        metadata["check"] = check
    if order:
        metadata["order"] = plain if order is True else order
    return dataclasses.field(default=default, init=init, kw_only=kw_only, metadata=metadata)


@dataclass_transform(frozen_default=True, field_specifiers=(field, dataclasses.field))
def stage(cls: type[T]) -> type[T]:
    """Makes `cls` a stage: a frozen dataclass whose fields `Stage.__post_init__` checks."""
    return dataclasses.dataclass(frozen=True)(cls)


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
