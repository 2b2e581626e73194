"""A tensor stage running the user's ``fn(batch, seeds)`` of TensorFlow ops on each batch.

The definition only (no TensorFlow here): `resumeloader.tfdata.tf_map` runs it in
the loader's tf.data graph (``map(..., num_parallel_calls=AUTOTUNE,
deterministic=True)``) and, for ``for batch in loader``, as a ``tf.function`` on the
same batches, with the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resumeloader.stages import base

__all__ = ["TFMapStage"]


class TFMapStage(base.TensorStage):
    """Applies ``fn(batch, seeds)`` to each batch; see `TensorStage` for the seeds."""

    name = "tf_map"

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self._fn = fn

    @property
    def fn(self) -> Callable[[Any, Any], Any]:
        return self._fn

    def describe(self) -> str:
        name = getattr(self._fn, "__qualname__", type(self._fn).__name__)
        return f"{name}(batch, seeds)"
