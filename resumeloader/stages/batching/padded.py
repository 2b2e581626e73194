"""The padded batch stage: consecutive positions, varying leaves padded into dense arrays."""

from __future__ import annotations

from typing import Any

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, padding

__all__ = ["PaddedBatchStage"]


class PaddedBatchStage(padding.PaddedStage):
    """`batch_size` records of consecutive positions per batch, varying leaves padded.

    Like `FixedBatchStage` (a batch never crosses an epoch boundary, an epoch's short
    last batch is dropped when `drop_remainder`), but each numeric leaf whose shape
    varies becomes one dense array: padded to the longest record of the batch, or to
    a fixed `pad_to` (see `resumeloader.stages.padding.Padding`). The batch size is
    not an order field (the records at each position do not depend on it), so a state
    can be resumed with another batch size, as with `Pipeline.batch`; the padding is.
    """

    name = "padded_batch"

    def __init__(
        self, batch_size: int, *, drop_remainder: bool, pad_to: Any, pad_value: Any,
        mask: bool, truncate: bool,
    ) -> None:
        super().__init__(pad_to=pad_to, pad_value=pad_value, mask=mask, truncate=truncate)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def drop_remainder(self) -> bool:
        return self._drop_remainder

    def assemble(self, columns: list[base.Column], spec: spec_lib.RecordSpec) -> list[Any]:
        return self.padding(spec).assemble(columns)

    def resized(self, batch_size: int) -> PaddedBatchStage:
        return PaddedBatchStage(batch_size, drop_remainder=self._drop_remainder, **self._pad)

    def order_fields(self) -> base.Fields:
        return self.pad_fields()

    def describe(self) -> str:
        drop = ", drop_remainder" if self._drop_remainder else ""
        return f"padded_batch({self._batch_size}{drop}, {self.pad_text()})"
