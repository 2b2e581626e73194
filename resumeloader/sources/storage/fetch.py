"""Ranged reads of objects: pinned to their version, retried, in parallel, cached, read ahead.

`read` takes the byte ranges a batch needs (object, start, stop) and returns their
bytes. Ranges already in the process's span cache (or on their way) are taken from
it; the others are grouped by object, widened to their *block* when the caller
aligns reads to blocks (the block order's chunks), and neighbours closer than
`ObjectReads.gap_bytes` are merged into one ranged GET of at most
`ObjectReads.max_get_bytes` (never a multi-range request: servers answer those with
the whole object). A GET longer than `ObjectReads.part_bytes` is sent as a few
ranged GETs of at most that many bytes, in parallel, each received into its place
in one buffer (one span: a long GET's time is mostly its transfer, which parts
share). The GETs run at most `ObjectReads.concurrency` at a time per process on
fsspec's event loop.

Every GET is pinned to the version the object had when the source was built
(S3 and HTTP ``If-Match``, the GCS ``generation``; the answer's version is checked
too): an object that changed raises `ObjectChangedError` naming it, never a mix of
old and new bytes. A GET that fails with a 5xx or 408/429 status, a reset or a
refused connection, a timeout (`ObjectReads.timeout` per try) or a short body is
tried again after a jittered exponential backoff, at most `ObjectReads.attempts`
times and within `ObjectReads.deadline` seconds; then `ObjectReadError` names the
object, the byte range, the tries and the last error. Other errors (403, 404) are
not retried. Nothing is handed out before its whole range arrived.

`prefetch` starts the GETs of ranges that a later batch will need (the order is
known in advance) and returns at once; at most `ObjectReads.readahead_bytes` of
prefetched bytes wait unread at any time (with ``"auto"``, what the loader chose:
`resumeloader.workers.readahead`). What is fetched only fills the cache: a
read returns the same bytes with or without it. The cache holds at most
`ObjectReads.cache_bytes` of finished spans (least recently used dropped first).
One GET per protocol is `resumeloader.sources.storage.protocols`; the cache,
`resumeloader.sources.storage.spans`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import errno
import itertools
import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from resumeloader.core import buffers
from resumeloader.sources.storage import answers, direct, objects, protocols, spans
from resumeloader.sources.storage.options import ObjectReads
from resumeloader.sources.storage.protocols import ObjectChangedError

__all__ = [
    "AUTO_BYTES", "DryReads", "DryRun", "ObjectChangedError", "ObjectReadError", "ObjectReads",
    "ahead_bytes", "budget_of", "clear", "merged", "prefetch", "read", "stats", "widest",
]

Range = tuple[objects.Object, int, int]
#: The read-ahead budget of ``readahead_bytes="auto"`` before a loader chooses one.
AUTO_BYTES = 64 << 20
#: (object, start, stop) -> the block (start, stop) that holds it, for aligned reads.
Blocks = Callable[[objects.Object, int, int], tuple[int, int]]


class ObjectReadError(OSError):
    """A ranged GET still failed after its tries (the message names the object, the
    byte range, the tries and the last error).

    Attributes:
        url: the object.
        start, stop: the byte range.
    """

    def __init__(self, msg: str, *, url: str, start: int, stop: int) -> None:
        super().__init__(errno.EIO, msg)
        self.url, self.start, self.stop = url, start, stop


class _ShortBody(OSError):
    pass


_semaphores: dict[tuple[int, int], asyncio.Semaphore] = {}
_counts: collections.Counter[str] = collections.Counter()
_counts_lock = threading.Lock()
#: This process's GETs now: waiting for a free slot, and in a try (the event loop's thread).
_in_flight: collections.Counter[str] = collections.Counter()
_widest = 0


async def _get(obj: objects.Object, start: int, stop: int, reads: ObjectReads,
               into: Any = None) -> Any:
    loop = asyncio.get_running_loop()
    key = (os.getpid(), reads.concurrency)
    gate = _semaphores.setdefault(key, asyncio.Semaphore(reads.concurrency))
    began = loop.time()
    deadline = began + reads.deadline
    last: BaseException | None = None
    tries = 0
    queued = 0.0  # seconds waiting for a free slot (other GETs in flight)
    for tries in range(1, reads.attempts + 1):
        try:
            asked = loop.time()
            _in_flight["waiting"] += 1
            try:
                await gate.acquire()
            finally:
                _in_flight["waiting"] -= 1
            _in_flight["trying"] += 1
            try:
                _counts["gets"] += 1
                sent = loop.time()
                queued += sent - asked
                left = max(0.001, min(reads.timeout, deadline - sent))
                data = await asyncio.wait_for(
                    protocols.get_once(obj, start, stop, into, left), left)
                _counts["get_ns"] += int((loop.time() - sent) * 1e9)
            finally:
                _in_flight["trying"] -= 1
                gate.release()
            if len(data) != stop - start:
                what = "short" if len(data) < stop - start else "long"
                raise _ShortBody(errno.EIO, f"{what} body: {len(data)} of {stop - start} bytes")
            _counts["bytes"] += len(data)
            return data
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if not protocols.retryable(err):
                if isinstance(err, (ObjectChangedError, answers.Refusal)):
                    raise  # a verdict on the object, not a failed read: named as it is
                last = err
                break
            last = err if not isinstance(err, asyncio.TimeoutError) else TimeoutError(
                f"no answer within {reads.timeout} s"
            )
        _counts["retries"] += 1
        wait = min(5.0, reads.backoff * 2 ** (tries - 1)) * (0.5 + random.random() / 2)
        if tries == reads.attempts or loop.time() + wait >= deadline:
            break
        await asyncio.sleep(wait)
    waited = (
        f", {queued:.1f} s of it waiting for one of the {reads.concurrency} GET slots"
        if queued >= 0.05 else ""
    )
    msg = (
        f"Reading bytes [{start}, {stop}) of {obj} failed after {tries} "
        f"{'try' if tries == 1 else 'tries'} in {loop.time() - began:.1f} s{waited} "
        f"(ObjectReads: attempts={reads.attempts}, deadline={reads.deadline} s); "
        f"the last error: {type(last).__name__}: {last}"
    )
    raise ObjectReadError(msg, url=obj.url, start=start, stop=stop) from last


async def _get_parts(obj: objects.Object, start: int, stop: int, reads: ObjectReads) -> Any:
    """Bytes [start, stop) of `obj` by ranged GETs of at most ``reads.part_bytes`` at
    once, each received into its place in one buffer (each retried on its own)."""
    out = buffers.empty((stop - start,), np.uint8)
    count = -(-(stop - start) // reads.part_bytes)
    cuts = [start + (stop - start) * k // count for k in range(count + 1)]
    parts = [asyncio.ensure_future(_get(obj, a, b, reads, out[a - start : b - start]))
             for a, b in itertools.pairwise(cuts)]
    try:
        await asyncio.gather(*parts)
    finally:
        for part in parts:
            part.cancel()
    return out


def _submit(obj: objects.Object, start: int, stop: int, reads: ObjectReads) -> Any:
    import fsspec.asyn

    loop = fsspec.asyn.get_loop()
    split = reads.part_bytes and stop - start > reads.part_bytes
    get = _get_parts if split else _get
    return asyncio.run_coroutine_threadsafe(get(obj, start, stop, reads), loop)


_CACHE = spans.Cache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _CACHE.__init__())  # type: ignore[misc]


def _key(obj: objects.Object) -> tuple[str, str, int]:
    return obj.url, obj.version, obj.size


def merged(ranges: Sequence[Range], reads: ObjectReads, blocks: Blocks | None) -> list[Range]:
    """The GETs that read `ranges` (none cached): each widened to its block (`blocks`),
    neighbours of one object closer than ``reads.gap_bytes`` merged into one GET of at
    most ``reads.max_get_bytes``; objects in the order they first appear."""
    wanted: dict[tuple[str, str, int], tuple[objects.Object, list[tuple[int, int]]]] = {}
    for obj, start, stop in ranges:
        if blocks is not None:
            start, stop = blocks(obj, start, stop)
        wanted.setdefault(_key(obj), (obj, []))[1].append((start, stop))
    gets: list[Range] = []
    for obj, wanted_spans in wanted.values():
        wanted_spans.sort()
        begin, end = wanted_spans[0]
        for start, stop in wanted_spans[1:]:
            if start - end <= reads.gap_bytes and max(end, stop) - begin <= reads.max_get_bytes:
                end = max(end, stop)
            else:
                gets.append((obj, begin, end))
                begin, end = start, stop
        gets.append((obj, begin, end))
    return gets


def _spans(ranges: Sequence[Range], reads: ObjectReads, blocks: Blocks | None, *, ahead: bool,
           budget: int | None = None, cache: spans.Cache = _CACHE,
           submit: Callable[[objects.Object, int, int, ObjectReads], Any] = _submit,
           ) -> list[spans.Span | None]:
    """The cached span of each range, the missing ones submitted (None where the
    read-ahead `budget` would be exceeded; all None, the cache left as it is, when the
    budget is full already, as a source's ``prefetch`` returns at once then)."""
    with cache.lock:
        if ahead and budget is not None and cache.ahead >= budget:
            return [None] * len(ranges)
        found = [cache.find(_key(o), a, b, reads.max_get_bytes) for o, a, b in ranges]
        missing = [r for r, span in zip(ranges, found, strict=True) if span is None]
        made: dict[tuple[str, str, int], list[spans.Span]] = {}
        for obj, start, stop in merged(missing, reads, blocks) if missing else []:
            if budget is not None and cache.ahead + (stop - start) > budget:
                break
            span = spans.Span(start, stop, submit(obj, start, stop, reads), ahead)
            cache.add(_key(obj), span)
            made.setdefault(_key(obj), []).append(span)
        # A range is served by its cached span or by one submitted here (taken from `made`,
        # not found again: a GET may already have failed, and the cache drops failed spans).
        out = [
            span or next(
                (m for m in made.get(_key(o), []) if m.start <= a and b <= m.stop), None
            )
            for (o, a, b), span in zip(ranges, found, strict=True)
        ]
        keep: frozenset[int] = frozenset()
        if not ahead:
            for used in out:
                if used is not None:
                    cache.used(used)
            keep = frozenset(id(used) for used in out)
        cache.shrink(reads.cache_bytes, keep)
    return out


def read(
    ranges: Sequence[Range], reads: ObjectReads, *, blocks: Blocks | None = None,
    cache: bool = True,
) -> list[memoryview]:
    """The bytes of each (object, start, stop) of `ranges`, in that order (with `cache`
    False: one GET each, not kept, e.g. for reading a whole object once).

    Raises:
        ObjectChangedError: an object is not the version it was.
        ObjectReadError: a GET still failed after its tries.
    """
    if cache:
        found = _spans(ranges, reads, blocks, ahead=False)
    else:
        found = [spans.Span(a, b, _submit(o, a, b, reads), False) for o, a, b in ranges]
    global _widest
    held = sum(span.stop - span.start for span in {id(s): s for s in found if s}.values())
    _widest = max(_widest, held)
    out = []
    wait = reads.deadline + reads.timeout + 5.0
    with _counts_lock:  # callers' threads (the GETs' counts: the event loop's one thread)
        _counts["ranges"] += len(ranges)
    cached = 0
    for (_, start, stop), span in zip(ranges, found, strict=True):
        assert span is not None
        if span.future.done():
            cached += 1
        try:
            data = span.future.result(timeout=wait)
        except concurrent.futures.TimeoutError as err:
            msg = (
                f"No answer for bytes [{span.start}, {span.stop}) within {wait} s. This "
                f"process's GETs now: {_in_flight['trying']} in a try, "
                f"{_in_flight['waiting']} waiting "
                f"for one of the {reads.concurrency} slots; "
                f"{direct.stats()['in_flight']} reader threads receiving."
            )
            raise TimeoutError(msg) from err
        out.append(memoryview(data)[start - span.start : stop - span.start])
    with _counts_lock:
        _counts["cached"] += cached
    return out


def budget_of(reads: ObjectReads, budget: int | None = None) -> int:
    """The read-ahead budget in bytes: ``reads.readahead_bytes``; for ``"auto"``,
    `budget` (a loader's choice), else `AUTO_BYTES` (at most half the cache)."""
    if isinstance(reads.readahead_bytes, int):
        return reads.readahead_bytes
    return budget if budget is not None else min(AUTO_BYTES, reads.cache_bytes // 2)


def prefetch(ranges: Sequence[Range], reads: ObjectReads, *, blocks: Blocks | None = None,
             budget: int | None = None) -> bool:
    """Starts reading `ranges` into the cache; False when the read-ahead budget is full
    (then not every range was started). `budget` is the budget of
    ``readahead_bytes="auto"`` (see `budget_of`)."""
    spans = _spans(ranges, reads, blocks, ahead=True, budget=budget_of(reads, budget))
    return all(span is not None for span in spans)


class DryRun:
    """The requests that reads would send, found without sending any.

    Objects' ranges (`read` and `prefetch`, called as `resumeloader.sources.storage.fetch.read`
    and `resumeloader.sources.storage.fetch.prefetch` are) go through the same merging
    (`merged`) and the same span cache rules (`resumeloader.sources.storage.spans`: a range
    inside a kept span is not read again; at most ``reads.cache_bytes`` kept, least
    recently used dropped first, read-ahead kept until read) as those functions, on a
    cache of its own in which GETs finish by the end of the next `read` (as for a process
    that reads its batches one after the other: a read waits for its own GETs, and a GET
    takes longer than the code between its start and the cache's next trim). A source
    that reads local files records each ``pread`` it would make (`pread`). `take` hands
    over what was recorded since the last call. With `cache_bytes`, its cache holds that
    many bytes instead of the reads' ``cache_bytes`` (the read-ahead budget unchanged).
    With `shadow`, each objects' read and read-ahead is also recorded in that other
    `DryRun` (another cache), so one dry read of the source serves both.

    Attributes:
        reads: the settings of the last objects' read recorded (None before one).
        get_bytes: the bytes of all GETs recorded so far (`take` leaves it).
        shadow: the `DryRun` that also records the objects' reads (None: none).
    """

    def __init__(self, *, cache_bytes: int | None = None,
                 shadow: DryRun | None = None) -> None:
        #: A ``cache_bytes`` of the dry cache in place of the reads' own (None: theirs).
        self.cache_bytes = cache_bytes
        self.shadow = shadow
        self.reads: ObjectReads | None = None
        self.get_bytes = 0
        #: What sources hold between reads in this dry run, by source (a source that
        #: holds local blocks keeps the blocks it would hold here).
        self.holdings: dict[Any, Any] = {}
        self._cache = spans.Cache()
        self._taken = DryReads([], [], 0)
        self._pending: list[concurrent.futures.Future[bytes]] = []

    def read(
        self, ranges: Sequence[Range], reads: ObjectReads, *, blocks: Blocks | None = None,
        cache: bool = True, wanted: int | None = None,
    ) -> None:
        """Records the GETs that ``read(ranges, reads, blocks=blocks, cache=cache)`` would
        send now, in the order it would send them (the cache updated as `read` would);
        `wanted` bytes of the ranges are records (default: all)."""
        if self.shadow is not None:
            self.shadow.read(ranges, reads, blocks=blocks, cache=cache, wanted=wanted)
        self.reads = reads
        self._taken.wanted_bytes += (
            sum(stop - start for _, start, stop in ranges) if wanted is None else wanted
        )
        if not cache:
            self._taken.sent.extend(ranges)
            self.get_bytes += sum(stop - start for _, start, stop in ranges)
            return
        self._taken.cached.extend(ranges)
        _spans(ranges, self._own(reads), blocks, ahead=False, cache=self._cache,
               submit=self._submit)
        for future in self._pending:  # `read` waits for its GETs after the cache shrank
            future.set_result(b"")
        self._pending = []

    def prefetch(
        self, ranges: Sequence[Range], reads: ObjectReads, *, blocks: Blocks | None = None
    ) -> bool:
        """Records the GETs that ``prefetch(ranges, reads, blocks=blocks)`` would start
        now (they finish by the end of the next `read`); False when the read-ahead budget
        is full, as there (the shadow's answer is not asked)."""
        if self.shadow is not None:
            self.shadow.prefetch(ranges, reads, blocks=blocks)
        self.reads = reads
        found = _spans(ranges, self._own(reads), blocks, ahead=True, budget=budget_of(reads),
                       cache=self._cache, submit=self._submit)
        return all(span is not None for span in found)

    def _own(self, reads: ObjectReads) -> ObjectReads:
        if self.cache_bytes is None or self.cache_bytes == reads.cache_bytes:
            return reads
        return dataclasses.replace(reads, cache_bytes=self.cache_bytes)

    def pread(self, path: str, start: int, stop: int, *, wanted: int | None = None) -> None:
        """Records one read of bytes ``[start, stop)`` of local file `path`, of which
        `wanted` bytes are records (default: all)."""
        self._taken.sent.append((path, start, stop))
        self._taken.wanted_bytes += stop - start if wanted is None else wanted

    def held(self, wanted: int) -> None:
        """Records `wanted` bytes of records read out of what a source holds (no request)."""
        self._taken.wanted_bytes += wanted

    def holds(self, obj: objects.Object, start: int, stop: int) -> bool:
        """Whether the cache holds a span of `obj` containing ``[start, stop)`` (nothing moves)."""
        return any(
            span.start <= start and span.stop >= stop for span in self._cache.spans.get(
                _key(obj), [])
        )

    def take(self) -> DryReads:
        """What was recorded since the last call."""
        taken, self._taken = self._taken, DryReads([], [], 0)
        return taken

    def _submit(self, obj: objects.Object, start: int, stop: int, _: ObjectReads) -> Any:
        self._taken.sent.append((obj, start, stop))
        self.get_bytes += stop - start
        self._pending.append(concurrent.futures.Future())
        return self._pending[-1]


@dataclasses.dataclass
class DryReads:
    """What `DryRun` recorded.

    Attributes:
        sent: each request, in order: (object, start, stop) for a GET, (local path,
            start, stop) for a pread.
        cached: the objects' ranges read through the cache (what the requests were for).
        wanted_bytes: the bytes of the records themselves (without gaps and widening).
    """

    sent: list[tuple[objects.Object | str, int, int]]
    cached: list[Range]
    wanted_bytes: int


def stats() -> dict[str, int]:
    """This process's GETs (tries included), retries, bytes received and nanoseconds
    spent in GETs so far; and the ranges read and how many of them were read already
    (by an earlier GET or read-ahead) when asked for."""
    return {key: int(_counts[key])
            for key in ("gets", "retries", "bytes", "get_ns", "ranges", "cached")}


def ahead_bytes() -> int:
    """The bytes this process read ahead (`prefetch`) and no read has used yet: in
    flight or waiting in the cache; at most the read-ahead budget."""
    with _CACHE.lock:
        return _CACHE.ahead


def widest(*, reset: bool = False) -> int:
    """The most bytes of spans one `read` of this process held at once (the working set
    that read-ahead must leave room for in the cache), since the last reset."""
    global _widest
    found, _widest = _widest, (0 if reset else _widest)
    return found


def clear() -> None:
    """Forgets every cached span (the next read of any range asks the store again).

    Safe under a live loader: GETs in flight are not cancelled — a read waiting for one
    still gets its bytes; the span is only no longer found by later reads.
    """
    with _CACHE.lock:
        _CACHE.__init__()  # type: ignore[misc]
