"""The token-budget batch stage: windows of records cut into padded batches of <= T tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, grouping, padding

__all__ = ["ALGORITHM", "TokenBudgetStage"]

# Changing how a window is cut or ordered changes every token-budget stream: bump it then.
ALGORITHM = "sorted-token-budget-v1"


class TokenBudgetStage(padding.PaddedStage):
    """Batches of as many records as fit `max_tokens` padded tokens; the count varies.

    The records of each window of `window` consecutive positions (aligned to the
    epoch's start; an epoch's last window may be shorter) are sorted by length (ties
    by position) — within each length bucket when `boundaries` are given (bucket
    ``i`` holds lengths in ``[boundaries[i - 1], boundaries[i])``) — and cut greedily
    so that each batch's padded size, records x its longest record, is at most
    `max_tokens` (`grouping.token_budget`; a record counts as at least one token),
    with at most `max_batch_size` records. The window's batches are emitted in an
    order that is a pure function of (seed, epoch, window). Each batch is padded to its
    longest record. A record's length is the longest first varying dimension of its
    padded leaves.

    Guarantees: each record of a window is in exactly one of its batches; a batch
    counts the records it holds, so the position after it is exact, but the number of
    batches of an epoch depends on the data. Every argument is an order field.

    Raises:
        GroupError: a record is longer than `max_tokens` (from `group`).
    """

    name = "tokens"

    def __init__(
        self, max_tokens: int, *, window: int, boundaries: tuple[int, ...] | None,
        max_batch_size: int | None, pad_value: Any, mask: bool,
    ) -> None:
        super().__init__(pad_to=None, pad_value=pad_value, mask=mask, truncate=False)
        if boundaries is not None and list(boundaries) != sorted(set(boundaries)):
            msg = (
                "`boundaries` must be strictly increasing lengths. "
                f"Received: boundaries={list(boundaries)}."
            )
            raise ValueError(msg)
        self._max_tokens = max_tokens
        self._window = window
        self._boundaries = boundaries
        self._max_batch_size = max_batch_size

    @property
    def batch_size(self) -> int:
        return self._max_batch_size or self._max_tokens

    @property
    def drop_remainder(self) -> bool:
        return False

    @property
    def window(self) -> int:
        return self._window

    @property
    def known_counts(self) -> bool:
        return False

    @property
    def batch_dim(self) -> int | None:
        return None

    def group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[base.Group]:
        lengths = self.padding(spec).lengths(columns)
        over = np.flatnonzero(lengths > self._max_tokens)
        if over.size:
            slot = int(over[0])
            msg = (
                f"A record of {int(lengths[slot])} tokens does not fit a batch of "
                f"max_tokens={self._max_tokens}. Truncate records in a map stage first, or "
                "raise max_tokens."
            )
            raise base.GroupError(msg, slot=slot)
        budget = np.maximum(lengths, 1)
        if self._boundaries is None:
            buckets = [np.arange(len(lengths), dtype=np.int64)]
        else:
            ids = np.searchsorted(np.asarray(self._boundaries), lengths, side="right")
            buckets = [np.flatnonzero(ids == b) for b in range(len(self._boundaries) + 1)]
        groups = []
        for slots in buckets:
            cut = grouping.token_budget(
                budget[slots], self._max_tokens, max_batch_size=self._max_batch_size
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
            f"records as fit max_tokens={self._max_tokens}. Received: batch_size={batch_size}."
        )
        raise ValueError(msg)

    def order_fields(self) -> base.Fields:
        boundaries = "none" if self._boundaries is None else ",".join(map(str, self._boundaries))
        return {
            "algorithm": ALGORITHM,
            "max_tokens": self._max_tokens,
            "window": self._window,
            "boundaries": boundaries,
            "max_batch_size": self._max_batch_size or 0,
            **self.pad_fields(),
        }

    def describe(self) -> str:
        cap = "" if self._max_batch_size is None else f", <= {self._max_batch_size} records"
        buckets = "" if self._boundaries is None else f", buckets {list(self._boundaries)}"
        return (
            f"batch_by_tokens({self._max_tokens} tokens, window {self._window}{cap}{buckets}, "
            f"{self.pad_text()})"
        )
