"""Whole objects copied into a bounded local folder, by version: for readers that need a file.

The ``array-record`` package reads a local path only (its reader takes a ``str`` and
opens it itself; no file-like object, and no ``s3://``), so an ArrayRecord object is
read from a local copy. `local_copy` downloads the whole object once (ranged GETs of
16 MiB pinned to its version, retried: `resumeloader.sources.storage.fetch`) into the
cache folder (``objects/`` of `Storage.cache_dir`) under a name made of its URL,
version and size, and returns the copy's path; a copy of another version is another
file, never reused. The folder holds at most `Storage.copies_bytes` (least recently
used copies removed first, never the one just made; a reader that has a removed copy
open keeps reading it).

The trade-off: the first read of any record of an object costs the whole object, and
the local disk needs room for the objects in use. With objects of a few hundred MB
and the block order's chunks lined up with objects, a window reads its objects once.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import tempfile
import threading

from resumeloader.sources.storage import fetch, locations, objects, options

__all__ = ["FOLDER", "copy_path", "local_copy", "prefetch"]

#: The folder of `Storage.cache_dir` that holds the copies.
FOLDER = "objects"
_PIECE = 16 << 20
_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pending: dict[str, concurrent.futures.Future[str]] = {}


def copy_path(obj: objects.Object, storage: options.Storage) -> str:
    """Where the copy of `obj` (this version) is kept."""
    folder = storage.under(FOLDER)
    key = f"{obj.url}\n{obj.version}\n{obj.size}".encode("utf-8", "surrogateescape")
    digest = hashlib.blake2b(key, digest_size=8).hexdigest()
    return os.path.join(folder, f"{digest}.{locations.display(obj.name)[:100]}")


def local_copy(obj: objects.Object, storage: options.Storage) -> str:
    """The path of a local copy of `obj`, downloaded if the folder has none.

    Raises:
        ObjectChangedError, ObjectReadError: see `resumeloader.sources.storage.fetch`.
        OSError: the copy cannot be written (e.g. the disk is full).
    """
    path, folder = copy_path(obj, storage), storage.under(FOLDER)
    with contextlib.suppress(OSError):
        if os.stat(path).st_size == obj.size:
            os.utime(path)  # recently used
            return path
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for start in range(0, obj.size, _PIECE):
                stop = min(obj.size, start + _PIECE)
                (view,) = fetch.read([(obj, start, stop)], storage.reads, cache=False)
                out.write(view)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _evict(folder, storage.copies_bytes, keep=path)
    return path


def _evict(folder: str, max_bytes: int, *, keep: str) -> None:
    with _lock:
        entries = []
        with os.scandir(folder) as found:
            for entry in found:
                if entry.is_file() and not entry.name.endswith(".part"):
                    stat = entry.stat()
                    entries.append((stat.st_mtime_ns, stat.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= max_bytes:
                return
            if path != keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    total -= size


def prefetch(obj: objects.Object, storage: options.Storage) -> None:
    """Starts downloading `obj` in the background (two at a time) if there is no copy."""
    global _pool
    path = copy_path(obj, storage)
    if os.path.exists(path):
        return
    with _lock:
        if path in _pending and not _pending[path].done():
            return
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="object-copy")
        future = _pool.submit(local_copy, obj, storage)
        _pending[path] = future
        future.add_done_callback(lambda _: _pending.pop(path, None))
