"""The span cache of object reads: finished and pending GETs, by object and byte range.

A `Span` is one GET's byte range of one object version and its future (its bytes, or
its error). `Cache` finds a span that holds a wanted range (any span containing it,
not only one of the same bounds), counts the bytes read ahead and not used yet, and
drops finished spans least recently used first; a failed span is dropped when found,
so that a later read tries again. `resumeloader.sources.storage.fetch` holds one per process
(under its lock).
"""

from __future__ import annotations

import bisect
import collections
import threading
from typing import Any

__all__ = ["Cache", "Key", "Span"]

#: (url, version, size): one version of one object.
Key = tuple[str, str, int]


class Span:
    __slots__ = ("ahead", "future", "start", "stop")

    def __init__(self, start: int, stop: int, future: Any, ahead: bool) -> None:
        self.start, self.stop, self.future, self.ahead = start, stop, future, ahead


class Cache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: dict[Key, list[Span]] = {}
        self.order: collections.OrderedDict[int, tuple[Key, Span]] = (
            collections.OrderedDict()
        )
        self.ahead = 0

    def find(self, key: Key, start: int, stop: int, limit: int) -> Span | None:
        spans = self.spans.get(key, [])
        at = bisect.bisect_right([s.start for s in spans], start)
        for span in reversed(spans[max(0, at - 64) : at]):
            if span.stop >= stop and span.start <= start:
                if span.future.done() and span.future.exception() is not None:
                    self._drop(key, span)  # a failed prefetch is read again
                    return None
                self.order.move_to_end(id(span))
                return span
            if span.start < start - limit:
                break
        return None

    def add(self, key: Key, span: Span) -> None:
        spans = self.spans.setdefault(key, [])
        bisect.insort(spans, span, key=lambda s: s.start)
        self.order[id(span)] = (key, span)
        if span.ahead:
            self.ahead += span.stop - span.start

    def used(self, span: Span) -> None:
        if span.ahead:
            span.ahead = False
            self.ahead -= span.stop - span.start

    def _drop(self, key: Key, span: Span) -> None:
        self.used(span)
        self.spans[key].remove(span)
        if not self.spans[key]:
            del self.spans[key]
        self.order.pop(id(span), None)

    def shrink(self, limit: int, keep: frozenset[int] = frozenset()) -> None:
        """Drops finished spans, least recently used first, until at most `limit` bytes
        are held; never one read ahead and not used yet, nor one of `keep` (ids of the
        spans a read is using: the next read would GET it again)."""
        total = sum(s.stop - s.start for _, s in self.order.values())
        for key, span in list(self.order.values()):
            if total <= limit:
                return
            if span.future.done() and not span.ahead and id(span) not in keep:
                self._drop(key, span)
                total -= span.stop - span.start
