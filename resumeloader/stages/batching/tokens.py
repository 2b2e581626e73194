"""`TokenBudgetStage`: windows of records cut into padded batches of <= T tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, fields
from resumeloader.stages.batching import grouping, padding

__all__ = ["TokenBudgetStage"]


def _boundaries(name: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        msg = (
            f"`{name}` must be a list or tuple of lengths, or None. "
            f"Received: {name}={value!r:.80} of type {type(value).__name__}."
        )
        raise TypeError(msg)
    boundaries = tuple(fields.count(f"{name}[]", b) for b in value)
    if list(boundaries) != sorted(set(boundaries)):
        msg = f"`{name}` must be strictly increasing lengths. Received: {name}={list(boundaries)}."
        raise ValueError(msg)
    return boundaries


def _boundaries_text(boundaries: tuple[int, ...] | None) -> str:
    return "none" if boundaries is None else ",".join(map(str, boundaries))


@dataclasses.dataclass(frozen=True)
class TokenBudgetStage(padding.PaddedStage, base.WindowedBatchStage):
    """Batches of as many records as fit `max_tokens` padded tokens; the count varies
    (`Pipeline.batch_by_tokens`).

    The records of each window of `window` consecutive positions (aligned to the
    epoch's start; an epoch's last window may be shorter) are sorted by length (ties
    by position) — within each length bucket when `boundaries` are given (bucket
    ``i`` holds lengths in ``[boundaries[i - 1], boundaries[i])``) — and cut greedily
    so that each batch's padded size, records x its longest record, is at most
    `max_tokens` (`grouping.token_budget`; a record counts as at least one token),
    with at most `max_batch_size` records. The window's batches are emitted in an
    order that is a pure function of (seed, epoch, window). Each batch is padded to its
    longest record (`pad_value`, `mask` as for `PaddedBatchStage`). A record's length
    is the longest first varying dimension of its padded leaves.

    Guarantees: each record of a window is in exactly one of its batches; a batch
    counts the records it holds, so the position after it is exact, but the number of
    batches of an epoch depends on the data (``len(loader)`` and ``batches_per_epoch``
    raise). Every argument is an order field. A record longer than `max_tokens`
    raises `RecordSpecError` naming it.

    Examples:
        >>> import numpy as np
        >>> from resumeloader import Pipeline, ResumableLoader
        >>> records = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
        >>> loader = ResumableLoader.from_pipeline(
        ...     Pipeline(records, seed=0).batch_by_tokens(8, window=8), num_epochs=1)
        >>> [(b.shape.as_list(), loader.position) for b in loader]   # position: records
        [([2, 4], 2), ([1, 6], 3), ([4, 2], 7), ([1, 5], 8)]
    """

    name = "tokens"
    # Changing how a window is cut or ordered changes every token-budget stream: bump it then.
    algorithm = "sorted-token-budget-v1"
    known_counts = False

    max_tokens: int = dataclasses.field(metadata=fields.meta(check=fields.count, order=True))
    window: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )
    boundaries: tuple[int, ...] | list[int] | None = dataclasses.field(
        default=None,
        kw_only=True,
        metadata=fields.meta(check=_boundaries, order=_boundaries_text),
    )
    max_batch_size: int | None = dataclasses.field(
        default=None,
        kw_only=True,
        metadata=fields.meta(check=fields.optional(fields.count), order=lambda n: n or 0),
    )
    # Padded to each batch's longest record, never cut: not arguments.
    pad_to: Any = dataclasses.field(
        default=None, init=False, metadata=fields.meta(order=fields.text("longest"))
    )
    truncate: bool = dataclasses.field(default=False, init=False, metadata=fields.meta(order=True))

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        return self.max_batch_size or self.max_tokens

    @property
    def batch_dim(self) -> int | None:
        return None

    def group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[base.Group]:
        lengths = self.padding(spec).lengths(columns)
        over = np.flatnonzero(lengths > self.max_tokens)
        if over.size:
            slot = int(over[0])
            msg = (
                f"A record of {int(lengths[slot])} tokens does not fit a batch of "
                f"max_tokens={self.max_tokens}. Truncate records in a map stage first, or "
                "raise max_tokens."
            )
            raise base.GroupError(msg, slot=slot)
        budget = np.maximum(lengths, 1)
        if self.boundaries is None:
            buckets = [np.arange(len(lengths), dtype=np.int64)]
        else:
            ids = np.searchsorted(np.asarray(self.boundaries), lengths, side="right")
            buckets = [np.flatnonzero(ids == b) for b in range(len(self.boundaries) + 1)]
        groups = []
        for slots in buckets:
            cut = grouping.token_budget(
                budget[slots], self.max_tokens, max_batch_size=self.max_batch_size
            )
            groups += [slots[g] for g in cut]
        order = grouping.batch_order(len(groups), seed=seed, epoch=epoch, window=window)
        return [base.Group(groups[i]) for i in order.tolist()]

    def assemble_group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, group: base.Group
    ) -> list[Any]:
        return self.padding(spec).assemble(columns, group.slots)

    def resized(self, batch_size: int) -> TokenBudgetStage:
        msg = (
            "A token-budget stage has no batch size to change: its batches hold as many "
            f"records as fit max_tokens={self.max_tokens}. Received: batch_size={batch_size}."
        )
        raise ValueError(msg)

    def describe(self) -> str:
        cap = "" if self.max_batch_size is None else f", <= {self.max_batch_size} records"
        buckets = "" if self.boundaries is None else f", buckets {list(self.boundaries)}"
        return (
            f"batch_by_tokens({self.max_tokens} tokens, window {self.window}{cap}{buckets}, "
            f"{self.pad_text()})"
        )
