"""`Layout`: position arithmetic, which records a batch covers and where the next one starts.

A position counts one shard's records across epochs (epoch * records_per_epoch +
offset). Batches are cut from the position the stream (re)starts at, never cross an
epoch boundary, and an epoch's short last batch is dropped when `drop_remainder`.
A position is *normalised* when it is not inside a dropped remainder. Advancing by
any number of batches is O(1) arithmetic (`Layout.advance`); the loop it replaces is
kept by the tests as the definition it must equal.

A windowed batch stage (bucketing, packing, token budgets) groups the records of
*windows* of `window` consecutive positions, aligned to the epoch's start (an epoch's
last window may be shorter). With `known_counts` each batch still counts as
`batch_size` positions, so all of the above holds; without, a batch counts the
records it holds, which only its window's data tells: the batch arithmetic here
does not apply (the consumer learns each batch's end from the producer).

A layout may skip ranges of positions (`skips`: a pipeline's skips, in this shard's
positions): its arithmetic is then `resumeloader.core.skips`' (batches never cross a
skip), O(number of skips). Pure Python.
"""

from __future__ import annotations

import dataclasses
import functools

from resumeloader.core import skips as skips_lib

__all__ = ["MAX_POSITION", "Layout"]

# Positions are stored in an int64 variable.
MAX_POSITION = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one shard's stream is cut into batches."""

    records_per_epoch: int
    batch_size: int
    drop_remainder: bool
    num_epochs: int | None
    #: Positions per window of a windowed batch stage, or None.
    window: int | None = None
    #: Whether every batch counts `batch_size` positions (an epoch's last the rest).
    known_counts: bool = True
    #: Ranges ``(start, stop)`` of positions never handed out: sorted, disjoint.
    skips: tuple[tuple[int, int], ...] = ()

    @functools.cached_property
    def skip_starts(self) -> list[int]:
        """The skips' starts, for bisection."""
        return [start for start, _ in self.skips]

    @functools.cached_property
    def regular(self) -> Layout:
        """This layout without its skips."""
        return dataclasses.replace(self, skips=())

    @property
    def end(self) -> int | None:
        """The position after the last record, or None when endless."""
        if self.num_epochs is None:
            return None
        return self.num_epochs * self.records_per_epoch

    def normalise(self, position: int) -> int:
        """Moves a position inside a dropped remainder to the next epoch's start (inside a
        skip, to its end)."""
        if self.skips:
            return skips_lib.normalise(self, position)
        offset = position % self.records_per_epoch
        left = self.records_per_epoch - offset
        if self.drop_remainder and offset and left < self.batch_size:
            position += left
        end = self.end
        return position if end is None else min(position, end)

    def window_bounds(self, position: int) -> tuple[int, int]:
        """The positions where the window holding `position` starts and ends."""
        assert self.window is not None
        epoch, offset = divmod(position, self.records_per_epoch)
        start = offset - offset % self.window
        stop = min(start + self.window, self.records_per_epoch)
        base = epoch * self.records_per_epoch
        return base + start, base + stop

    def batch_end(self, position: int) -> int:
        """The position after the batch that starts at normalised `position`."""
        self._check_counts("batch_end")
        if self.skips:
            return skips_lib.batch_end(self, position)
        offset = position % self.records_per_epoch
        return position + min(self.batch_size, self.records_per_epoch - offset)

    @property
    def batches_per_epoch(self) -> int:
        """Batches of an epoch read from its start (at least 1; of an epoch without skips)."""
        self._check_counts("batches_per_epoch")
        full, rest = divmod(self.records_per_epoch, self.batch_size)
        return max(1, full + (1 if rest and not self.drop_remainder else 0))

    def advance(self, position: int, num_batches: int) -> int:
        """The normalised position after `num_batches` batches from `position`, in O(1).

        Raises:
            ValueError: an endless stream would pass `MAX_POSITION`.
        """
        self._check_counts("advance")
        if self.skips:
            return skips_lib.advance(self, position, num_batches)
        position = self.normalise(position)
        end = self.end
        if num_batches <= 0 or (end is not None and position >= end):
            return position
        # A normalised position before the end always starts a batch.
        left = max(1, self.batches_left_in_epoch(position))
        if num_batches < left:
            return position + num_batches * self.batch_size
        epochs, batches = divmod(num_batches - left, self.batches_per_epoch)
        epoch = position // self.records_per_epoch + 1 + epochs
        if self.num_epochs is not None and epoch >= self.num_epochs:
            return self.num_epochs * self.records_per_epoch
        advanced = epoch * self.records_per_epoch + batches * self.batch_size
        if advanced > MAX_POSITION:
            msg = (
                f"Advancing by {num_batches} batches from position {position} passes the "
                f"largest position, 2**63 - 1 records. Received: num_batches={num_batches}."
            )
            raise ValueError(msg)
        return advanced

    def batches_to_end(self, position: int) -> int | None:
        """Batches from normalised `position` to the end of a finite stream; None if endless."""
        self._check_counts("batches_to_end")
        end = self.end
        if end is None:
            return None
        if position >= end:
            return 0
        if self.skips:
            return skips_lib.batches_to_end(self, position)
        epochs_after = self.num_epochs - position // self.records_per_epoch - 1  # type: ignore[operator]
        return self.batches_left_in_epoch(position) + epochs_after * self.batches_per_epoch

    def batches_left_in_epoch(self, position: int) -> int:
        """Batches from normalised `position` to the end of its epoch (0 past the end)."""
        self._check_counts("batches_left_in_epoch")
        if self.end is not None and position >= self.end:
            return 0
        if self.skips:
            return skips_lib.batches_left_in_epoch(self, position)
        left = self.records_per_epoch - position % self.records_per_epoch
        full, rest = divmod(left, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def epoch_step(self, position: int) -> int:
        """Batches of normalised `position`'s epoch before it (cut from the epoch's start;
        skipped positions are no steps)."""
        self._check_counts("epoch_step")
        if self.skips:
            return skips_lib.epoch_step(self, position)
        return -(-(position % self.records_per_epoch) // self.batch_size)

    def _check_counts(self, what: str) -> None:
        if not self.known_counts:
            msg = (
                f"`Layout.{what}` needs batches of known size, but this layout's batches "
                "count the records they hold (a packing or token-budget stage)."
            )
            raise ValueError(msg)
