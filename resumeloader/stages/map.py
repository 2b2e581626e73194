"""A record stage running the user's ``map_fn(record, rng)`` in Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader.core import rng
from resumeloader.stages import base

__all__ = ["MapStage"]


class MapStage(base.RecordStage):
    """Applies ``fn(record, rng)``; ``rng`` is `record_rng(seed, epoch, record index)`."""

    name = "map"

    def __init__(self, fn: Callable[[Any, np.random.Generator], Any], *, seed: int) -> None:
        self.fn = fn
        self._seed = seed

    def apply(self, record: Any, *, epoch: int, index: int) -> Any:
        return self.fn(record, rng.record_rng(self._seed, epoch, index))

    def describe(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"{name}(record, rng)"
