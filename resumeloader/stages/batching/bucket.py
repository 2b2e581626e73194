"""The bucketing batch stage: windows of records sorted by length, cut into padded batches."""

from __future__ import annotations

from typing import Any

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, grouping, padding

__all__ = ["ALGORITHM", "BucketStage"]

# Changing how a window is cut or ordered changes every bucketed stream: bump it then.
ALGORITHM = "sorted-chunks-v1"


class BucketStage(padding.PaddedStage):
    """Batches of records of similar length, each counting `batch_size` positions.

    The records of each window of `window` consecutive positions (aligned to the
    epoch's start; `window` a multiple of `batch_size`; an epoch's last window may be
    shorter) are sorted by length (ties by position) and cut into batches of
    `batch_size` (`grouping.sorted_chunks`). The window's full batches are emitted in
    an order that is a pure function of (seed, epoch, window) (`grouping.batch_order`);
    a short batch (only in an epoch's last window) comes last, or is dropped with
    `drop_remainder`. Each batch is padded (see `resumeloader.stages.padding`); a
    record's length is the longest first varying dimension of its padded leaves.

    Guarantees: each record of a window is in exactly one of its batches; batch ``r``
    of a window counts as the positions ``[r * batch_size, (r + 1) * batch_size)`` of
    it, so the number of batches per epoch, ``len``, Keras' ``steps_per_epoch`` and
    graph advances stay exact and O(1). The window and batch size are order fields.
    """

    name = "bucket"

    def __init__(
        self, batch_size: int, *, window: int, drop_remainder: bool, pad_to: Any,
        pad_value: Any, mask: bool, truncate: bool,
    ) -> None:
        super().__init__(pad_to=pad_to, pad_value=pad_value, mask=mask, truncate=truncate)
        if window % batch_size:
            msg = (
                "`window` must be a multiple of `batch_size`, so that every batch but an "
                f"epoch's last is full. Received: window={window}, batch_size={batch_size}."
            )
            raise ValueError(msg)
        self._batch_size = batch_size
        self._window = window
        self._drop_remainder = drop_remainder

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def drop_remainder(self) -> bool:
        return self._drop_remainder

    @property
    def window(self) -> int:
        return self._window

    def group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[base.Group]:
        lengths = self.padding(spec).lengths(columns)
        chunks = grouping.sorted_chunks(lengths, self._batch_size)
        full = [c for c in chunks if len(c) == self._batch_size]
        short = [c for c in chunks if len(c) < self._batch_size]
        order = grouping.batch_order(len(full), seed=seed, epoch=epoch, window=window)
        groups = [base.Group(full[i]) for i in order.tolist()]
        if short and not self._drop_remainder:
            groups.append(base.Group(short[0]))
        return groups

    def assemble_group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, group: base.Group
    ) -> list[Any]:
        return self.padding(spec).assemble(columns, group.slots)

    def resized(self, batch_size: int) -> BucketStage:
        return BucketStage(
            batch_size, window=self._window, drop_remainder=self._drop_remainder, **self._pad
        )

    def order_fields(self) -> base.Fields:
        return {
            "algorithm": ALGORITHM,
            "window": self._window,
            "batch_size": self._batch_size,
            **self.pad_fields(),
        }

    def describe(self) -> str:
        drop = ", drop_remainder" if self._drop_remainder else ""
        return (
            f"bucket_by_length({self._batch_size}, window {self._window}{drop}, "
            f"{self.pad_text()})"
        )

