"""`BucketStage`: windows of records sorted by length, cut into padded batches."""

from __future__ import annotations

import dataclasses
from typing import Any

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, fields
from resumeloader.stages.batching import grouping, padding

__all__ = ["BucketStage"]


@dataclasses.dataclass(frozen=True)
class BucketStage(padding.PaddedStage, base.WindowedBatchStage):
    """Batches of records of similar length, each counting `batch_size` positions
    (`Pipeline.bucket_by_length`).

    The records of each window of `window` consecutive positions (aligned to the
    epoch's start; `window` a multiple of `batch_size`; an epoch's last window may be
    shorter) are sorted by length (ties by position) and cut into batches of
    `batch_size` (`grouping.sorted_chunks`). The window's full batches are emitted in
    an order that is a pure function of (seed, epoch, window) (`grouping.batch_order`);
    a short batch (only in an epoch's last window) comes last, or is dropped with
    `drop_remainder`. Each batch is padded as by `PaddedBatchStage` (`pad_to`,
    `pad_value`, `mask`, `truncate`); a record's length is the longest first varying
    dimension of its padded leaves.

    Guarantees: each record of a window is in exactly one of its batches; batch ``r``
    of a window counts as the positions ``[r * batch_size, (r + 1) * batch_size)`` of
    it, so the number of batches per epoch, ``len``, Keras' ``steps_per_epoch`` and
    graph advances stay exact and O(1). The window and batch size are order fields; a
    restore inside a window recomputes that window and continues after the batch the
    position names.

    Examples:
        >>> import numpy as np
        >>> from resumeloader import Pipeline, ResumableLoader
        >>> data = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
        >>> pipeline = Pipeline(data, seed=0).bucket_by_length(2, window=8)
        >>> loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
        >>> [b.shape.as_list() for b in loader]   # [records, padded length]
        [[2, 2], [2, 6], [2, 1], [2, 4]]
    """

    name = "bucket"
    # Changing how a window is cut or ordered changes every bucketed stream: bump it then.
    algorithm = "sorted-chunks-v1"

    batch_size: int = dataclasses.field(metadata=fields.meta(check=fields.count, order=True))
    window: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )
    drop_remainder: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag)
    )

    def check(self) -> None:
        if self.window % self.batch_size:
            msg = (
                "`window` must be a multiple of `batch_size`, so that every batch but an "
                f"epoch's last is full. Received: window={self.window}, "
                f"batch_size={self.batch_size}."
            )
            raise ValueError(msg)

    def group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[base.Group]:
        lengths = self.padding(spec).lengths(columns)
        chunks = grouping.sorted_chunks(lengths, self.batch_size)
        full = [c for c in chunks if len(c) == self.batch_size]
        short = [c for c in chunks if len(c) < self.batch_size]
        order = grouping.batch_order(len(full), seed=seed, epoch=epoch, window=window)
        groups = [base.Group(full[i]) for i in order.tolist()]
        if short and not self.drop_remainder:
            groups.append(base.Group(short[0]))
        return groups

    def assemble_group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, group: base.Group
    ) -> list[Any]:
        return self.padding(spec).assemble(columns, group.slots)

    def describe(self) -> str:
        drop = ", drop_remainder" if self.drop_remainder else ""
        return (
            f"bucket_by_length({self.batch_size}, window {self.window}{drop}, "
            f"{self.pad_text()})"
        )
