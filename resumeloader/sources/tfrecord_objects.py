"""TFRecord objects read by ranges: the blocks that hold records, the record a failure is about.

`TFRecordSource` reads records as byte ranges (`resumeloader.sources.storage.ranges`).
`Blocks` widens an object's range to its block of `block_records` consecutive records
of the source (the block order's chunk: one GET, cached, serves every record of it),
cut at object boundaries; `failing` names the record a failed read is about.
"""

from __future__ import annotations

import numpy as np

from resumeloader.sources import tfrecord_index as index_lib
from resumeloader.sources.storage import objects

__all__ = ["Blocks", "failing"]


def _stop(ix: index_lib.FileIndex, number: int) -> int:
    return ix.size if number + 1 == len(ix.offsets) else int(ix.offsets[number + 1])


class Blocks:
    """(object, start, stop) -> the byte range of the block of `block_records` records
    (counted from the source's first record) that holds it, within its object."""

    def __init__(
        self, indexes: list[index_lib.FileIndex], starts: np.ndarray, block_records: int
    ) -> None:
        self._indexes, self._starts, self._size = indexes, starts, block_records
        self._file_of = {ix.path: file for file, ix in enumerate(indexes)}

    def __call__(self, obj: objects.Object, start: int, stop: int) -> tuple[int, int]:
        file = self._file_of[obj.url]
        ix, first = self._indexes[file], int(self._starts[file])
        local = int(np.searchsorted(ix.offsets, start, side="right")) - 1
        begin = max(0, (first + local) // self._size * self._size - first)
        end = min(len(ix.offsets), begin + self._size)
        return int(ix.offsets[begin]), max(stop, _stop(ix, end - 1))


def failing(
    err: Exception, positions: list[int], paths: list[str], starts: np.ndarray,
    stops: np.ndarray,
) -> int:
    """The position (of `positions`, whose objects are `paths`) of the first record that
    the read error `err` (naming an object, and a byte range if it has one) is about."""
    url = getattr(err, "url", None)
    low, high = getattr(err, "start", None), getattr(err, "stop", None)
    for p, path in zip(positions, paths, strict=True):
        if path == url and (low is None or (starts[p] < high and stops[p] > low)):
            return p
    for p, path in zip(positions, paths, strict=True):
        if objects.display_url(path) in str(err):
            return p
    return positions[0]
