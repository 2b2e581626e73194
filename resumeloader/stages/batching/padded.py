"""`PaddedBatchStage`: consecutive positions, varying leaves padded into dense arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, fields
from resumeloader.stages.batching import padding

__all__ = ["PaddedBatchStage"]


@dataclasses.dataclass(frozen=True)
class PaddedBatchStage(padding.PaddedStage, base.PlainBatchStage):
    """`batch_size` records of consecutive positions per batch, varying leaves padded
    (`Pipeline.padded_batch`).

    Like `FixedBatchStage` (a batch never crosses an epoch boundary, an epoch's short
    last batch is dropped when `drop_remainder`), but each numeric leaf whose shape
    varies becomes one dense array: padded to the longest record of the batch, or to
    a fixed `pad_to`. Strings are not padded. The batch size is not an order field
    (the records at each position do not depend on it), so a state can be resumed
    with another batch size, as with `Pipeline.batch`; the padding is.

    Args:
        batch_size: records per batch.
        pad_to: None (the longest record of each batch), a length, or a mapping of
            a dict record's keys to either.
        pad_value: the fill value, or a mapping of a dict record's keys to one.
        mask: add a boolean mask per padded leaf, True where a record has data:
            ``"<key>_mask"`` beside it in a dict record; a record that is one
            array becomes ``(values, mask)``.
        truncate: cut records longer than `pad_to` (else they raise
            `RecordSpecError` naming the record).
        drop_remainder: drop each epoch's short last batch.

    Examples:
        >>> import numpy as np
        >>> from resumeloader import Pipeline, ResumableLoader
        >>> data = {"tokens": [np.arange(1, n + 1) for n in (3, 1, 4, 2)]}
        >>> pipeline = Pipeline(data, seed=0).padded_batch(2, mask=True)
        >>> batch = next(iter(ResumableLoader.from_pipeline(pipeline)))
        >>> batch["tokens"].numpy().tolist(), batch["tokens_mask"].numpy().tolist()
        ([[1, 2, 3], [1, 0, 0]], [[True, True, True], [True, False, False]])
    """

    name = "padded_batch"

    batch_size: int = dataclasses.field(metadata=fields.meta(check=fields.count))
    drop_remainder: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag)
    )

    def assemble(self, columns: list[base.Column], spec: spec_lib.RecordSpec) -> list[Any]:
        return self.padding(spec).assemble(columns)

    def describe(self) -> str:
        drop = ", drop_remainder" if self.drop_remainder else ""
        return f"padded_batch({self.batch_size}{drop}, {self.pad_text()})"
