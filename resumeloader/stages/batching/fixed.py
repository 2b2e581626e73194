"""`FixedBatchStage`: the fixed-size batch stage, consecutive positions stacked."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, fields

__all__ = ["FixedBatchStage"]


@dataclasses.dataclass(frozen=True)
class FixedBatchStage(base.PlainBatchStage):
    """`batch_size` records of consecutive positions per batch, stacked leaf by leaf
    (`Pipeline.batch`).

    A batch never crosses an epoch boundary; an epoch's short last batch is dropped
    when `drop_remainder`. A leaf whose shape varies (a ``None`` dimension) stays a
    list of the records' arrays (it becomes a ``tf.RaggedTensor``). The batch size
    is not an order field: the global order of records does not depend on it, so a
    state can be resumed with another batch size.

    Raises:
        TypeError, ValueError: `batch_size` is not an integer in [1, 2**62], or
            `drop_remainder` not a bool.
    """

    name = "batch"
    stacks = True

    batch_size: int = dataclasses.field(metadata=fields.meta(check=fields.count))
    drop_remainder: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag)
    )

    def assemble(self, columns: list[base.Column], spec: spec_lib.RecordSpec) -> list[Any]:
        # Strings and ragged leaves stay lists (the wire format encodes them); a source's
        # read_batch gives arrays already.
        return [
            column if leaf.variable or isinstance(column, np.ndarray) else np.stack(column)
            for column, leaf in zip(columns, spec.leaves, strict=True)
        ]

    def describe(self) -> str:
        drop = ", drop_remainder" if self.drop_remainder else ""
        return f"batch({self.batch_size}{drop})"
