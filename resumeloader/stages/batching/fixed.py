"""The fixed-size batch stage: consecutive positions, stacked."""

from __future__ import annotations

from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base

__all__ = ["FixedBatchStage"]


class FixedBatchStage(base.BatchStage):
    """`batch_size` records of consecutive positions per batch, stacked leaf by leaf.

    A batch never crosses an epoch boundary; an epoch's short last batch is dropped
    when `drop_remainder`. A leaf whose shape varies (a ``None`` dimension) stays a
    list of the records' arrays (it becomes a ``tf.RaggedTensor``). The batch size
    is not an order field: the global order of records does not depend on it, so a
    state can be resumed with another batch size.
    """

    name = "batch"

    def __init__(self, batch_size: int, *, drop_remainder: bool) -> None:
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def drop_remainder(self) -> bool:
        return self._drop_remainder

    @property
    def stacks(self) -> bool:
        return True

    def assemble(self, columns: list[base.Column], spec: spec_lib.RecordSpec) -> list[Any]:
        # Strings and ragged leaves stay lists (the wire format encodes them); a source's
        # read_batch gives arrays already.
        return [
            column if leaf.variable or isinstance(column, np.ndarray) else np.stack(column)
            for column, leaf in zip(columns, spec.leaves, strict=True)
        ]

    def resized(self, batch_size: int) -> FixedBatchStage:
        return FixedBatchStage(batch_size, drop_remainder=self._drop_remainder)

    def describe(self) -> str:
        drop = ", drop_remainder" if self._drop_remainder else ""
        return f"batch({self._batch_size}{drop})"
