"""Open files, a bounded number at once: the one place file-backed sources open what they read.

A process may hold only so many file descriptors (``ulimit -n``, 1024 by default on
most Linux systems), and a dataset may have far more files. `CACHE` opens a file
when a read needs it and keeps it open for the next read; past its budget it closes
the least recently used handle that no read is using. The budget is a quarter of the
process's soft limit, at most 1024 (`budget`). A handle is opened again when it is
needed again, so any number of files can be read with any limit that leaves room
for one; an open that still fails for lack of descriptors raises `TooManyOpenFiles`
naming ``ulimit -n``.

A handle is keyed by what it reads and by the stamp of the file it expects (its
size and modification time when it was indexed): a file opened again after it was
replaced or rewritten raises `StaleFileError` instead of handing out other bytes.
The cache is per process (a forked child forgets the parent's handles).

A handle is anything with a ``close`` (a descriptor, a format's reader object).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import os
import resource
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CACHE",
    "HandleCache",
    "StaleFileError",
    "TooManyOpenFiles",
    "budget",
    "opened",
    "pread",
    "pread_into",
    "pread_into_files",
    "stats",
]

_MAX_BUDGET = 1024
_MIN_BUDGET = 4
_EXHAUSTED = (errno.EMFILE, errno.ENFILE)

Stamp = tuple[int, int]  # (size, st_mtime_ns)


class TooManyOpenFiles(OSError):
    """No descriptor is left for a file even after closing every idle cached handle."""


class StaleFileError(OSError):
    """A file opened again is not the file that was indexed (its size or time changed).

    Attributes:
        url: the file's path (or the object's URL), when known.
    """

    def __init__(self, *args: object, url: str | None = None) -> None:
        super().__init__(*args)
        self.url = url


def budget() -> int:
    """How many handles the cache keeps open: a quarter of ``ulimit -n``, in [4, 1024]."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_BUDGET
    return max(_MIN_BUDGET, min(_MAX_BUDGET, soft // 4))


def _too_many(what: str, held: int, err: OSError) -> TooManyOpenFiles:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    msg = (
        f"Cannot open {what}: the process has no file descriptor left ({err.strerror}). "
        f"Its limit (`ulimit -n`) is {limit} (hard limit {hard}); resumeloader keeps at "
        f"most {budget()} files open and holds {held} now, so other code holds the rest. "
        "Raise the limit in the shell that starts the job (e.g. `ulimit -n 65536`) or "
        "close files elsewhere."
    )
    return TooManyOpenFiles(errno.EMFILE, msg)


class _Entry:
    __slots__ = ("close", "handle", "users")

    def __init__(self, handle: Any, close: Callable[[Any], None]) -> None:
        self.handle, self.close, self.users = handle, close, 0


class HandleCache:
    """Handles opened on demand, at most `budget()` kept open (least recently used closed).

    A handle in use by a read is never closed under it; while every cached handle is
    in use the cache may exceed its budget by the number of concurrent reads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def use(
        self, key: Any, open_: Callable[[], Any], close: Callable[[Any], None], what: str
    ) -> Iterator[Any]:
        """The handle of `key` (opened by `open_` if not cached) for the block's duration."""
        entry = self.acquire(key, open_, close, what)
        try:
            yield entry.handle
        finally:
            self.release([entry])

    def acquire(
        self, key: Any, open_: Callable[[], Any], close: Callable[[Any], None], what: str
    ) -> _Entry:
        """`use` without a block: the entry of `key`'s handle (``.handle``), in use until
        `release` is given it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.users += 1
                return entry
        handle = self.open(open_, what)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(handle, close)
            else:  # another thread opened it meanwhile: keep one
                close(handle)
            entry.users += 1
            self._shrink(budget())
        return entry

    def release(self, entries: list[_Entry]) -> None:
        """Ends the use of `entries` (from `acquire`)."""
        with self._lock:
            for entry in entries:
                entry.users -= 1

    def open(self, open_: Callable[[], Any], what: str) -> Any:
        """`open_()`; when no descriptor is left, every idle handle is closed first and
        it is tried once more (then `TooManyOpenFiles`)."""
        try:
            return open_()
        except OSError as err:
            if err.errno not in _EXHAUSTED:
                raise
            with self._lock:
                self._shrink(0)  # every idle handle, then once more
                held = len(self._entries)
            try:
                return open_()
            except OSError as again:
                if again.errno not in _EXHAUSTED:
                    raise
                raise _too_many(what, held, again) from again

    def _shrink(self, size: int) -> None:
        """Closes idle handles, least recently used first, until at most `size` are open."""
        if len(self._entries) <= size:
            return
        for key in [k for k, e in self._entries.items() if e.users == 0]:
            entry = self._entries.pop(key)
            with contextlib.suppress(Exception):
                entry.close(entry.handle)
            if len(self._entries) <= size:
                return

    def clear(self) -> None:
        """Closes every idle handle (a handle in use stays until its read ends)."""
        with self._lock:
            self._shrink(0)

    def _forget(self) -> None:
        # In a forked child: the parent's handles are the parent's (closed here, unused).
        self._lock = threading.Lock()
        entries, self._entries = self._entries, collections.OrderedDict()
        for entry in entries.values():
            with contextlib.suppress(Exception):
                entry.close(entry.handle)


#: The process's cache, shared by every source (the descriptor limit is per process).
CACHE = HandleCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=CACHE._forget)


def _check(fd: int, path: str, stamp: Stamp) -> None:
    stat = os.fstat(fd)
    if (stat.st_size, stat.st_mtime_ns) != stamp:
        msg = (
            f"{path} changed since it was indexed: it had {stamp[0]} bytes (modified at "
            f"{stamp[1]} ns), it has {stat.st_size} bytes (modified at "
            f"{stat.st_mtime_ns} ns). Build the source again to read the new file."
        )
        raise StaleFileError(errno.ESTALE, msg, url=path)


def _open_fd(path: str, stamp: Stamp | None) -> int:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if stamp is not None:
        try:
            _check(fd, path, stamp)
        except StaleFileError:
            os.close(fd)
            raise
    return fd


def pread(path: str, length: int, offset: int, *, stamp: Stamp | None = None) -> bytes:
    """`length` bytes of `path` from `offset`, through a cached descriptor; with a
    `stamp`, the file is checked after the read (a file rewritten in place under a
    cached descriptor is caught too: one ``fstat`` per read).

    Raises:
        StaleFileError: the file's size or modification time is not `stamp`.
        TooManyOpenFiles: no descriptor is left for it (see the module docstring).
    """
    key = ("fd", path, stamp)
    with CACHE.use(key, lambda: _open_fd(path, stamp), os.close, repr(path)) as fd:
        data = os.pread(fd, length, offset)
        if stamp is not None:
            _check(fd, path, stamp)
    with _counts_lock:
        _counts["reads"] += 1
        _counts["bytes"] += len(data)
    return data


def pread_into(
    path: str, reads: list[tuple[memoryview, int]], *, stamp: Stamp | None = None
) -> list[int]:
    """Reads each ``(buffer, offset)`` of `reads`: as many bytes of `path` from
    `offset` as `buffer` holds, into it (one ``preadv`` each, one cached descriptor
    and, with a `stamp`, one check after them all, as `pread`'s). Returns the bytes
    each read (fewer at the end of the file).

    Raises:
        StaleFileError: the file's size or modification time is not `stamp`.
        TooManyOpenFiles: no descriptor is left for it (see the module docstring).
    """
    return pread_into_files([(path, stamp)], [reads])[0]


def pread_into_files(
    files: list[tuple[str, Stamp | None]], reads: list[list[tuple[memoryview, int]]]
) -> list[list[int]]:
    """`pread_into` of many files at once: ``reads[k]`` from file ``files[k]`` (path,
    stamp), each file's descriptor taken from the cache and checked after its reads,
    with no per-file context manager or lock round trip (a batch over many files)."""
    entries: list[_Entry] = []
    done: list[list[int]] = []
    try:
        for (path, stamp), wanted in zip(files, reads, strict=True):
            entry = CACHE.acquire(
                ("fd", path, stamp), functools.partial(_open_fd, path, stamp), os.close,
                repr(path),
            )
            entries.append(entry)
            fd = entry.handle
            done.append([os.preadv(fd, [buffer], offset) for buffer, offset in wanted])
            if stamp is not None:
                _check(fd, path, stamp)
    finally:
        CACHE.release(entries)
    with _counts_lock:
        _counts["reads"] += sum(map(len, done))
        _counts["bytes"] += sum(map(sum, done))
    return done


_counts: collections.Counter[str] = collections.Counter()
_counts_lock = threading.Lock()


def stats() -> dict[str, int]:
    """This process's `pread` calls and bytes read so far."""
    with _counts_lock:
        return {key: int(_counts[key]) for key in ("reads", "bytes")}


class File:
    """A file opened for one task (`opened`): its size and ranged reads."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        stat = os.fstat(fd)
        self.size, self.mtime_ns = stat.st_size, stat.st_mtime_ns

    def pread(self, length: int, offset: int) -> bytes:
        """`length` bytes from `offset` (fewer at the end of the file)."""
        return os.pread(self._fd, length, offset)


@contextlib.contextmanager
def opened(path: str) -> Iterator[File]:
    """`path` opened for the block only (closed after it; a cache of idle handles is
    closed first when no descriptor is left)."""
    fd = CACHE.open(lambda: os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), repr(path))
    try:
        yield File(fd)
    finally:
        os.close(fd)
