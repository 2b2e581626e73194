"""Batch arithmetic of a layout with skipped ranges of positions (`Layout.skips`).

A skip ``[a, b)`` (this shard's positions) is never handed out: a position inside it
is normalised to ``b`` (the loader jumps; the position counts skipped records, steps
do not). Batches never cross a skip, as they never cross an epoch: the *segments* of
an epoch are its positions between skips, and a batch holds consecutive positions of
one segment (the one before a skip's start ends short when that start is not a batch
boundary; with ``drop_remainder`` a segment's short last batch is dropped like an
epoch's). Everything is O(number of skips) per call, jumping over the epochs without
skips with the plain layout's O(1) arithmetic; a layout without skips never comes
here. Pure Python.
"""

from __future__ import annotations

import bisect
from typing import Protocol

__all__ = [
    "advance",
    "batch_end",
    "batches_left_in_epoch",
    "batches_to_end",
    "epoch_step",
    "normalise",
    "segment_end",
]


class _Regular(Protocol):
    """The plain arithmetic of a layout without skips (`Layout.regular`)."""

    @property
    def batches_per_epoch(self) -> int: ...

    def advance(self, position: int, num_batches: int) -> int: ...

    def batches_left_in_epoch(self, position: int) -> int: ...


class Layout(Protocol):
    """What this module reads of a `resumeloader.core.positions.Layout` (which calls it:
    a protocol rather than an import, so the two modules form no import cycle)."""

    @property
    def records_per_epoch(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def drop_remainder(self) -> bool: ...

    @property
    def skips(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def skip_starts(self) -> list[int]: ...

    @property
    def end(self) -> int | None: ...

    @property
    def regular(self) -> _Regular: ...


def _containing(layout: Layout, position: int) -> tuple[int, int] | None:
    """The skip holding `position`, if any."""
    at = bisect.bisect_right(layout.skip_starts, position) - 1
    if at >= 0 and position < layout.skips[at][1]:
        return layout.skips[at]
    return None


def _next_start(layout: Layout, position: int) -> int | None:
    """The first skip start after `position`, if any."""
    at = bisect.bisect_right(layout.skip_starts, position)
    return layout.skip_starts[at] if at < len(layout.skips) else None


def segment_end(layout: Layout, position: int) -> int:
    """Where the segment holding live `position` ends: a skip's start or its epoch's end."""
    epoch_end = (position // layout.records_per_epoch + 1) * layout.records_per_epoch
    following = _next_start(layout, position)
    return epoch_end if following is None else min(epoch_end, following)


def normalise(layout: Layout, position: int) -> int:
    """`position`, moved past a skip it lies in and a dropped remainder (repeatedly)."""
    end, per_epoch, size = layout.end, layout.records_per_epoch, layout.batch_size
    while end is None or position < end:
        skip = _containing(layout, position)
        if skip is not None:
            position = skip[1]
            continue
        if layout.drop_remainder:
            stop = segment_end(layout, position)
            whole_epoch = position % per_epoch == 0 and stop - position == per_epoch
            if stop - position < size and not whole_epoch:
                position = stop
                continue
        return position
    return end


def _batches(layout: Layout, start: int, stop: int) -> int:
    """Batches cut from `start` in the segment ending at `stop`."""
    full, rest = divmod(stop - start, layout.batch_size)
    return full + (1 if rest and not layout.drop_remainder else 0)


def batch_end(layout: Layout, position: int) -> int:
    """The position after the batch that starts at normalised `position`."""
    return position + min(layout.batch_size, segment_end(layout, position) - position)


def batches_left_in_epoch(layout: Layout, position: int) -> int:
    """Batches from `position` to the end of its epoch."""
    epoch = position // layout.records_per_epoch
    count, at = 0, normalise(layout, position)
    end = layout.end
    while (end is None or at < end) and at // layout.records_per_epoch == epoch:
        stop = segment_end(layout, at)
        count += _batches(layout, at, stop)
        at = normalise(layout, stop)
    return count


def epoch_step(layout: Layout, position: int) -> int:
    """Batches of normalised `position`'s epoch before it, cut from the epoch's start."""
    per_epoch = layout.records_per_epoch
    epoch = position // per_epoch
    count, at = 0, normalise(layout, epoch * per_epoch)
    while at < position and at // per_epoch == epoch:
        stop = segment_end(layout, at)
        if stop >= position:
            return count + -(-(position - at) // layout.batch_size)
        count += _batches(layout, at, stop)
        at = normalise(layout, stop)
    return count


def advance(layout: Layout, position: int, num_batches: int) -> int:
    """The normalised position after `num_batches` batches from `position`."""
    regular, per_epoch, end = layout.regular, layout.records_per_epoch, layout.end
    at, left = normalise(layout, position), num_batches
    while left > 0 and (end is None or at < end):
        following = _next_start(layout, at)
        if following is None or (end is not None and following >= end):
            return regular.advance(at, left)
        epoch, skip_epoch = at // per_epoch, following // per_epoch
        if skip_epoch > epoch:  # plain epochs up to the one the skip starts in
            plain = regular.batches_left_in_epoch(at) + (
                skip_epoch - epoch - 1
            ) * regular.batches_per_epoch
            if left < plain:
                return regular.advance(at, left)
            left -= plain
            at = normalise(layout, skip_epoch * per_epoch)
            continue
        count = _batches(layout, at, following)
        if left < count:
            return at + left * layout.batch_size
        left -= count
        at = normalise(layout, following)
    return at if end is None else min(at, end)


def batches_to_end(layout: Layout, position: int) -> int:
    """Batches from `position` to the end of a finite layout."""
    regular, per_epoch, end = layout.regular, layout.records_per_epoch, layout.end
    assert end is not None
    count, at = 0, normalise(layout, position)
    while at < end:
        following = _next_start(layout, at)
        epoch = at // per_epoch
        if following is None or following >= end or following // per_epoch > epoch:
            count += regular.batches_left_in_epoch(at)
            last = end // per_epoch if following is None or following >= end else (
                following // per_epoch
            )
            count += max(0, last - epoch - 1) * regular.batches_per_epoch
            at = normalise(layout, max(epoch + 1, last) * per_epoch)
            continue
        count += _batches(layout, at, following)
        at = normalise(layout, following)
    return count
