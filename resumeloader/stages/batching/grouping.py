"""How the records of one window are grouped into batches or packed rows (pure NumPy).

Every function here is a pure function of the records' lengths and its arguments:
ties are broken by the record's slot in the window (its position order), so the same
window always gives the same groups, in any process. Each returns groups of *slots*
(indices into the window) covering every slot exactly once. `batch_order` is the
seeded order in which a window's groups are emitted.
"""

from __future__ import annotations

import numpy as np

from resumeloader.core import sampler

__all__ = [
    "batch_order",
    "boundary_buckets",
    "first_fit_decreasing",
    "sorted_chunks",
    "token_budget",
]

_ORDER_TAG = 0xB0C4_E7ED_0BDE_5EED


def batch_order(count: int, *, seed: int, epoch: int, window: int) -> np.ndarray:
    """A permutation of ``range(count)``: a pure function of (seed, epoch, window, count).

    The order in which a windowed stage emits the groups of window `window` of epoch
    `epoch`, so that batches of similar records do not come sorted by length.
    """
    key = sampler.epoch_hash(seed ^ _ORDER_TAG, epoch)
    return sampler.permute(count, key, window, np.arange(count, dtype=np.int64))


def _by_length(lengths: np.ndarray, *, descending: bool = False) -> np.ndarray:
    """Slots ordered by length, ties by slot (a stable sort)."""
    keys = -lengths if descending else lengths
    return np.argsort(keys, kind="stable")


def sorted_chunks(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Slots sorted by length and cut into consecutive groups of `batch_size`.

    Records of similar length share a batch (little padding) and the number of groups
    is known in advance: ``ceil(len(lengths) / batch_size)``.
    """
    order = _by_length(lengths)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def boundary_buckets(
    lengths: np.ndarray, boundaries: tuple[int, ...], batch_size: int
) -> list[np.ndarray]:
    """Slots grouped by length bucket (``[b_i, b_{i+1})``), each bucket cut into batches.

    Bucket ``i`` holds lengths in ``[boundaries[i - 1], boundaries[i])`` (the first from 0,
    the last unbounded); within a bucket slots keep their window order. A bucket's last
    batch may be short, so the number of groups depends on the lengths.
    """
    buckets = np.searchsorted(np.asarray(boundaries), lengths, side="right")
    groups = []
    for bucket in range(len(boundaries) + 1):
        slots = np.flatnonzero(buckets == bucket)
        groups += [slots[i : i + batch_size] for i in range(0, len(slots), batch_size)]
    return groups


def token_budget(
    lengths: np.ndarray, max_tokens: int, *, max_batch_size: int | None = None
) -> list[np.ndarray]:
    """Slots sorted by length and cut greedily so that each group's padded size
    (``len(group) * longest``) is at most `max_tokens`.

    A record longer than `max_tokens` gets a group of its own (the caller decides
    whether that is an error). At most `max_batch_size` slots per group when given.
    """
    order = _by_length(lengths)
    groups: list[np.ndarray] = []
    start = 0
    limit = len(order) if max_batch_size is None else max_batch_size
    # Sorted ascending, a group's longest record is its last one.
    for end in range(1, len(order) + 1):
        size = end - start
        longest = int(lengths[order[end - 1]])
        if size > 1 and (size * longest > max_tokens or size > limit):
            groups.append(order[start : end - 1])
            start = end - 1
    if start < len(order):
        groups.append(order[start:])
    return groups


def first_fit_decreasing(lengths: np.ndarray, capacities: np.ndarray) -> list[np.ndarray]:
    """Bins of slots: each record, longest first, goes into the first bin where it fits.

    Args:
        lengths: ``[num_records, num_leaves]`` lengths of each record's packed leaves
            (a 1-D array for one leaf).
        capacities: ``[num_leaves]`` capacity of a bin for each leaf.

    Returns:
        The bins in the order they were opened; within a bin, slots in the order they
        were placed. Every slot is in exactly one bin.

    Raises:
        ValueError: a record does not fit an empty bin.
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(len(lengths), -1)
    capacities = np.asarray(capacities, dtype=np.int64).reshape(-1)
    too_long = np.flatnonzero((lengths > capacities).any(axis=1))
    if too_long.size:
        slot = int(too_long[0])
        msg = (
            f"A record is longer than a packed row. Received: lengths "
            f"{lengths[slot].tolist()} at slot {slot} of the window, row capacity "
            f"{capacities.tolist()}. Truncate records in a map stage first."
        )
        raise ValueError(msg)
    # Longest first by the leaf that fills its capacity most, ties by slot.
    fill = (lengths / np.maximum(capacities, 1)).max(axis=1)
    order = np.argsort(-fill, kind="stable")
    # Room left in each bin, one column per bin; at most one bin per record is opened.
    remaining = np.repeat(capacities[:, None], max(len(lengths), 1), axis=1)
    bins: list[list[int]] = []
    for slot in order.tolist():
        need = lengths[slot][:, None]
        fits = np.flatnonzero((remaining[:, : len(bins)] >= need).all(axis=0))
        row = int(fits[0]) if fits.size else len(bins)
        if row == len(bins):
            bins.append([])
        remaining[:, row] -= lengths[slot]
        bins[row].append(slot)
    return [np.asarray(b, dtype=np.int64) for b in bins]
