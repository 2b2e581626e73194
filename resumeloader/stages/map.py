"""`MapStage`: a record stage running the user's ``map_fn(record, rng)`` in Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader.core import rng
from resumeloader.stages import base, fields

__all__ = ["MapStage", "function"]


def function(name: str, value: Any) -> Any:
    """Checks that `value` is callable."""
    if not callable(value):
        msg = (
            f"`{name}` must be callable. "
            f"Received: {name}={value!r} of type {type(value).__name__}."
        )
        raise TypeError(msg)
    return value


@dataclasses.dataclass(frozen=True)
class MapStage(base.RecordStage):
    """Applies ``fn(record, rng)``; ``rng`` is `record_rng(seed, epoch, record index)`,
    keyed by the pipeline's seed (`apply` receives it)."""

    name = "map"

    fn: Callable[[Any, np.random.Generator], Any] = dataclasses.field(
        metadata=fields.meta(check=function)
    )

    def apply(self, record: Any, *, seed: int, epoch: int, index: int) -> Any:
        generator = rng.lend(seed, epoch, index)
        record = self.fn(record, generator)
        rng.give_back(generator)
        return record

    def describe(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"{name}(record, rng)"
