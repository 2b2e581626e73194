"""`CacheNeed`: the cache a sequence of object reads needs so that no byte is read twice.

The process's span cache (`resumeloader.sources.storage.spans`) keeps what GETs read,
least recently used dropped first, within ``ObjectReads.cache_bytes`` (never a span the
current read uses, nor one read ahead and not used yet). A span is found again later
only if fewer than ``cache_bytes`` of spans were used after it before each trim: its
*reuse distance* (the bytes of the spans used since it was last used, its own
included, as the cache orders them before a read). `CacheNeed` follows the reads of a
run (the ranges each step reads, the GETs it sends; a GET merged across a span the
cache holds keeps it beside the new one, as the cache does) and gives the largest
reuse distance of a span GET and used again in one epoch, and the bytes that GETs read
a second time in an epoch because the cache had dropped them. Across epochs a span is
read again unless the cache holds the whole data: that is counted in the GETs, not here.

The GETs depend on what the cache holds (neighbours are merged only when missing), so
the need is found on reads with a cache that drops nothing within `limit` (what a cache
of that need reads within an epoch), the re-reads on the reads with the cache as set
(`resumeloader.tools.plan_reads`).

It holds no bytes: one small entry per span, at most `MAX_SPANS` of them and at most
`limit` bytes' worth; what it forgot past that is counted as ``forgot``. A GET of bytes
of a span it forgot in the same epoch (and the reads ran on a cache of `limit` bytes,
which dropped it too) is a reuse farther than it follows: counted as ``beyond``, the
need is then larger than ``limit``, not measured (`need` is only what was seen).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["MAX_SPANS", "CacheNeed"]

#: The most spans remembered.
MAX_SPANS = 1 << 18


@dataclasses.dataclass
class _Entry:
    key: tuple[str, str]
    obj: Any
    start: int
    stop: int
    step: int
    epoch: int
    made: int  # the order spans were added in (the cache finds the newest of one start)
    fetched: int  # the epoch of its GET

    @property
    def size(self) -> int:
        return self.stop - self.start


class CacheNeed:
    """Reuse distances and re-read bytes of object reads (see the module docstring).

    Args:
        limit: the most bytes of spans remembered.

    Attributes:
        need: the largest reuse distance within an epoch seen (bytes).
        reread: bytes that GETs read again in an epoch of spans the cache had dropped.
        forgot: spans forgotten past the limits (a later reuse of one is not seen).
        beyond: bytes that GETs read again in an epoch of spans forgotten in it: a reuse
            farther than `limit` (the need is larger than `limit`).
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.need = self.reread = self.forgot = self.beyond = 0
        self._order: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._by_key: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (start, made) sorted
        self._made = 0
        self._held = 0
        # The spans forgotten in `_epoch` that it used, by key: (start, stop) sorted.
        self._forgotten: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self._forgotten_spans = 0
        self._epoch = -1

    def step(self, step: int, epoch: int, ranges: Sequence[tuple[Any, int, int]],
             gets: Sequence[tuple[Any, int, int]],
             held: Callable[[Any, int, int], bool]) -> tuple[int, int]:
        """One step's reads (of `epoch`): the object `ranges` it read through the cache,
        then the `gets` it sent (objects: ``url`` and ``version`` attributes); `held`
        tells whether the cache still holds a span. Returns the step's largest reuse
        distance and the bytes its GETs read again of spans the cache had dropped, both
        of spans last used in the same epoch (a later epoch reads its data again unless
        the cache holds all of it; a GET merged across a span the cache holds reads its
        bytes again too, but not for want of room)."""
        reread = 0
        if epoch != self._epoch:
            self._epoch, self._forgotten, self._forgotten_spans = epoch, {}, 0
        before: dict[int, int] = {}  # the epoch a span was last used in before this step
        hits = [self._find((obj.url, obj.version), start, stop) for obj, start, stop in ranges]
        distance = self._distance({
            found.made for found in hits
            if found is not None and found.step != step and found.epoch == found.fetched == epoch
        })
        for found in hits:
            if found is None:
                continue
            before.setdefault(id(found), found.epoch)
            found.step, found.epoch = step, epoch
            self._order.move_to_end(found.made)
        for obj, start, stop in gets:
            key = (obj.url, obj.version)
            self.beyond += self._refetched(key, start, stop)
            for old in self._overlapping(key, start, stop):
                if held(old.obj, old.start, old.stop):
                    continue  # the cache keeps it beside the new span, as here
                if before.pop(id(old), old.epoch) == epoch:
                    reread += min(old.stop, stop) - max(old.start, start)
                self._drop(old)
            self._add(_Entry(key, obj, start, stop, step, epoch, self._made, epoch))
            self._made += 1
        while len(self._order) > MAX_SPANS or self._held > self.limit:
            self._forget(next(iter(self._order.values())))
        self.need = max(self.need, distance)
        self.reread += reread
        return distance, reread

    def _distance(self, reused: set[int]) -> int:
        """The largest, over the spans `reused` (by `made`), of the bytes of the spans used
        after one was last used, and its own (as the cache orders them before a read)."""
        total = most = 0
        for other in reversed(self._order.values()):
            if not reused:
                break
            total += other.size
            if other.made in reused:
                reused.discard(other.made)
                most = total
        return most

    def _find(self, key: tuple[str, str], start: int, stop: int) -> _Entry | None:
        found = self._by_key.get(key, [])
        at = bisect.bisect_right(found, (start, float("inf")))
        for _, made in reversed(found[max(0, at - 64) : at]):
            entry = self._order[made]
            if entry.start <= start and entry.stop >= stop:
                return entry
        return None

    def _overlapping(self, key: tuple[str, str], start: int, stop: int) -> list[_Entry]:
        found = self._by_key.get(key, [])
        at = bisect.bisect_left(found, (stop, -1))
        out = []
        for _, made in reversed(found[max(0, at - 64) : at]):
            entry = self._order[made]
            if entry.stop > start:
                out.append(entry)
        return out

    def _forget(self, entry: _Entry) -> None:
        """Drops `entry` past the limits, remembering where it was if used in this epoch."""
        self._drop(entry)
        self.forgot += 1
        if entry.epoch == self._epoch and self._forgotten_spans < MAX_SPANS:
            bisect.insort(self._forgotten.setdefault(entry.key, []), (entry.start, entry.stop))
            self._forgotten_spans += 1

    def _refetched(self, key: tuple[str, str], start: int, stop: int) -> int:
        """The bytes of ``[start, stop)`` in spans of `key` forgotten in this epoch (then
        forgotten for good: the GET's new span is followed instead)."""
        found = self._forgotten.get(key)
        if not found:
            return 0
        at = bisect.bisect_left(found, (stop, -1))
        hit = [k for k in range(max(0, at - 64), at) if found[k][1] > start]
        clipped = sorted((max(found[k][0], start), min(found[k][1], stop)) for k in hit)
        for k in reversed(hit):
            del found[k]
        self._forgotten_spans -= len(hit)
        total, reached = 0, start
        for first, last in clipped:  # their union: forgotten spans may overlap
            total += max(0, last - max(first, reached))
            reached = max(reached, last)
        return total

    def _add(self, entry: _Entry) -> None:
        self._order[entry.made] = entry
        bisect.insort(self._by_key.setdefault(entry.key, []), (entry.start, entry.made))
        self._held += entry.size

    def _drop(self, entry: _Entry) -> None:
        del self._order[entry.made]
        spans = self._by_key[entry.key]
        spans.remove((entry.start, entry.made))
        if not spans:
            del self._by_key[entry.key]
        self._held -= entry.size
