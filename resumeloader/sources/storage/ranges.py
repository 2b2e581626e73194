"""Byte ranges of any location: local files by coalesced preads, objects by ranged GETs.

`read` takes ``(location, start, stop)`` ranges — local files and objects mixed — and
returns their bytes in that order. Ranges of one local file closer than `GAP` are
read with one ``pread`` (at most `MAX_READ` bytes) through the process's handle cache
(`resumeloader.sources.storage.handles`), refused with `StaleFileError` if the file
changed since the source was built; objects' ranges go through
`resumeloader.sources.storage.fetch` (pinned to their version, merged, retried,
cached). A failure names its location (the error's ``url``): a record format maps
it to the record it was reading. `Sequential` reads one location from start to end in
large pieces, for formats that walk a file once (an index build) or libraries that
take a file-like object.

The bytes come back as memoryviews over the buffer each read filled (one per pread or
GET), so that a format may slice records out of them without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from resumeloader.sources.storage import fetch, handles, locations, objects
from resumeloader.sources.storage.options import ObjectReads

__all__ = ["GAP", "MAX_READ", "Range", "Sequential", "cut", "dry_read", "read"]

#: (location, start, stop): bytes [start, stop) of a local file or an object.
Range = tuple[locations.Location, int, int]
#: Ranges of one local file closer than this are read with one pread (the gap too).
GAP = 1 << 14
#: The most bytes one local pread reads.
MAX_READ = 1 << 22


def read(
    ranges: Sequence[Range], reads: ObjectReads, *, blocks: fetch.Blocks | None = None,
    cache: bool = True,
) -> list[memoryview]:
    """The bytes of each range, in order (objects' with `fetch.read`'s `blocks` and
    `cache`; see there).

    Raises:
        StaleFileError: a local file changed since the source was built.
        ObjectChangedError: an object is not the version it was.
        ObjectReadError: a GET still failed after its tries.
    """
    out: list[memoryview] = [memoryview(b"")] * len(ranges)
    remote = [k for k, (where, _, _) in enumerate(ranges) if isinstance(where, objects.Object)]
    if remote:
        wanted = [ranges[k] for k in remote]
        views = fetch.read(wanted, reads, blocks=blocks, cache=cache)  # type: ignore[arg-type]
        for k, view in zip(remote, views, strict=True):
            out[k] = view
    for group in _local_groups(ranges):
        _read_group(ranges, group, out)
    return out


def dry_read(
    ranges: Sequence[Range], reads: ObjectReads, dry: fetch.DryRun, *,
    blocks: fetch.Blocks | None = None, cache: bool = True,
) -> None:
    """Records in `dry` the GETs and preads that ``read(ranges, reads, blocks=blocks,
    cache=cache)`` makes, without making them (see `fetch.DryRun`)."""
    remote = [r for r in ranges if isinstance(r[0], objects.Object)]
    if remote:
        dry.read(remote, reads, blocks=blocks, cache=cache)  # type: ignore[arg-type]
    for group in _local_groups(ranges):
        where = ranges[group[0]][0]
        assert isinstance(where, locations.LocalFile)
        begin, end = ranges[group[0]][1], max(ranges[k][2] for k in group)
        dry.pread(where.path, begin, end, wanted=sum(ranges[k][2] - ranges[k][1] for k in group))


def cut(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Where the runs of neighbouring ranges begin, as `read` groups one local file's
    ranges into preads: `starts` and `stops` (int64) sorted by start, of one file or of
    files laid end to end more than `GAP` apart; returns the positions (in the sorted
    ranges) that begin a run, the first included."""
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    begins = np.flatnonzero(np.concatenate(([True], starts[1:] - stops[:-1] > GAP)))
    ends = np.append(begins[1:], len(starts))
    if not (stops[ends - 1] - starts[begins] > MAX_READ).any():
        return begins
    out: list[int] = []  # rare: a run longer than MAX_READ, cut where `read` cuts it
    for begin, end in zip(begins.tolist(), ends.tolist(), strict=True):
        first = begin
        out.append(first)
        for k in range(begin + 1, end):
            if int(stops[k]) - int(starts[first]) > MAX_READ:
                first = k
                out.append(first)
    return np.asarray(out, dtype=np.int64)


def _local_groups(ranges: Sequence[Range]) -> list[list[int]]:
    """The positions of the local files' ranges, cut into groups read by one pread."""
    local = sorted(
        (k for k, (where, _, _) in enumerate(ranges) if isinstance(where, locations.LocalFile)),
        key=lambda k: (ranges[k][0].path, ranges[k][1]),  # type: ignore[union-attr]
    )
    groups: list[list[int]] = []
    for k in local:
        if groups and _joins(ranges, groups[-1], k):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def _joins(ranges: Sequence[Range], group: list[int], k: int) -> bool:
    first, last = ranges[group[0]], ranges[group[-1]]
    here = ranges[k]
    return bool(
        here[0] == first[0] and here[1] - last[2] <= GAP and here[2] - first[1] <= MAX_READ
    )


def _read_group(ranges: Sequence[Range], group: list[int], out: list[memoryview]) -> None:
    where = ranges[group[0]][0]
    assert isinstance(where, locations.LocalFile)
    begin = ranges[group[0]][1]
    end = max(ranges[k][2] for k in group)
    view = memoryview(handles.pread(where.path, end - begin, begin, stamp=where.stamp))
    for k in group:
        out[k] = view[ranges[k][1] - begin : ranges[k][2] - begin]


class Sequential:
    """One location read in order, in pieces of `piece` bytes: ``pread(length, offset)``
    serves reads that fall in the last piece without another read (an index build
    walking a file's headers costs one GET or pread per piece).

    Attributes:
        location: what is read.
        size: its length in bytes.
    """

    def __init__(
        self, location: locations.Location, reads: ObjectReads, *, piece: int = 16 << 20
    ) -> None:
        self.location, self.size, self._reads, self._piece = location, location.size, reads, piece
        self._buffer, self._start = memoryview(b""), 0

    def pread(self, length: int, offset: int) -> bytes:
        """`length` bytes from `offset` (fewer at the end)."""
        length = max(0, min(length, self.size - offset))
        at = offset - self._start
        if at < 0 or at + length > len(self._buffer):
            stop = min(self.size, offset + max(length, self._piece))
            if stop <= offset:
                return b""
            (self._buffer,) = read([(self.location, offset, stop)], self._reads, cache=False)
            self._start, at = offset, 0
        return bytes(self._buffer[at : at + length])

