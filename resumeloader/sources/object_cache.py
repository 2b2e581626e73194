"""Whole objects copied into a bounded local folder, by version: for readers that need a file.

The ``array-record`` package reads a local path only (its reader takes a ``str`` and
opens it itself; no file-like object, and no ``s3://``), so an ArrayRecord object is
read from a local copy. `local_copy` downloads the whole object once (ranged GETs of
16 MiB pinned to its version, retried: `resumeloader.sources.fetch`) into the cache
folder under a name made of its URL, version and size, and returns the copy's path;
a copy of another version is another file, never reused. The folder holds at most
`max_bytes` (least recently used copies removed first, never the one just made; a
reader that has a removed copy open keeps reading it).

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

from resumeloader.sources import fetch, storage
from resumeloader.sources import files as files_lib

__all__ = ["DEFAULT_BYTES", "default_dir", "local_copy", "prefetch"]

#: The default bound of the cache folder.
DEFAULT_BYTES = 8 << 30
_PIECE = 16 << 20
_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pending: dict[str, concurrent.futures.Future[str]] = {}


def default_dir() -> str:
    """``$RESUMELOADER_CACHE_DIR/objects`` or ``~/.cache/resumeloader/objects``."""
    root = os.environ.get("RESUMELOADER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "resumeloader"
    )
    return os.path.join(root, "objects")


def copy_path(obj: storage.Object, folder: str) -> str:
    """Where the copy of `obj` (this version) is kept in `folder`."""
    key = f"{obj.url}\n{obj.version}\n{obj.size}".encode("utf-8", "surrogateescape")
    digest = hashlib.blake2b(key, digest_size=8).hexdigest()
    return os.path.join(folder, f"{digest}.{files_lib.display(obj.name)[:100]}")


def local_copy(
    obj: storage.Object, folder: str, reads: fetch.ObjectReads, *, max_bytes: int = DEFAULT_BYTES
) -> str:
    """The path of a local copy of `obj`, downloaded if the folder has none.

    Raises:
        ObjectChangedError, ObjectReadError: see `resumeloader.sources.fetch`.
        OSError: the copy cannot be written (e.g. the disk is full).
    """
    path = copy_path(obj, folder)
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
                (view,) = fetch.read([(obj, start, stop)], reads, cache=False)
                out.write(view)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _evict(folder, max_bytes, keep=path)
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


def prefetch(
    obj: storage.Object, folder: str, reads: fetch.ObjectReads, *, max_bytes: int = DEFAULT_BYTES
) -> None:
    """Starts downloading `obj` in the background (two at a time) if there is no copy."""
    global _pool
    path = copy_path(obj, folder)
    if os.path.exists(path):
        return
    with _lock:
        if path in _pending and not _pending[path].done():
            return
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="object-copy")
        future = _pool.submit(local_copy, obj, folder, reads, max_bytes=max_bytes)
        _pending[path] = future
        future.add_done_callback(lambda _: _pending.pop(path, None))
