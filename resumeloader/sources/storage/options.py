"""The option values of storage: `Storage` (what a file source takes) and `ObjectReads`.

`Storage` holds everything about *where and how* a file-backed source reads bytes —
the objects' filesystem options, how GETs are made (`ObjectReads`), the local folder
for what is kept on disk and its bound — and nothing about *which* bytes: none of it
is an order field, so a checkpoint restores under any of them. A new storage option
is a field here, not a keyword threaded through every source.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from typing import Any

from resumeloader.core import validate

__all__ = ["ObjectReads", "Storage", "cache_root", "given"]

#: The default bound of the local copies of objects kept in ``cache_dir``.
COPIES_BYTES = 8 << 30
#: What may identify a source's objects in a checkpoint (`Storage.identity`).
IDENTITIES = ("versions", "content")


def cache_root() -> str:
    """``$RESUMELOADER_CACHE_DIR``, else ``$XDG_CACHE_HOME/resumeloader`` or
    ``~/.cache/resumeloader``: where what is kept on local disk goes by default."""
    return os.environ.get("RESUMELOADER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "resumeloader"
    )


@dataclasses.dataclass(frozen=True)
class ObjectReads:
    """How objects are read (not what is read: none of it changes the stream).

    Attributes:
        concurrency: GETs in flight at once in a process, >= 1.
        attempts: tries of one GET before it fails, >= 1.
        timeout: seconds one try may take (connecting, waiting, reading the body).
        deadline: seconds all tries of one GET may take, waits included.
        backoff: the first wait between tries (s); doubled per try, at most 5 s,
            jittered by up to half.
        gap_bytes: ranges of one object closer than this are read with one GET.
        max_get_bytes: the most bytes one GET reads (merging stops there).
        part_bytes: a GET of more bytes (a block, or merged ranges) is sent as
            ranged GETs of at most this many bytes, in parallel (0: never split).
        cache_bytes: the most bytes of finished GETs the process keeps in memory.
        readahead_bytes: the most prefetched bytes that wait unread, or ``"auto"``
            (the default): chosen by the loader as it runs, from the bytes it reads
            per second and the measured GET time, within half of `cache_bytes` and
            the RAM budget (each choice logged and in ``loader.stats().decisions``).
            0 reads nothing ahead.
    """

    concurrency: int = 16
    attempts: int = 5
    timeout: float = 30.0
    deadline: float = 120.0
    backoff: float = 0.1
    gap_bytes: int = 1 << 20
    max_get_bytes: int = 32 << 20
    part_bytes: int = 8 << 20
    cache_bytes: int = 256 << 20
    readahead_bytes: int | str = "auto"

    def __post_init__(self) -> None:
        for name in ("concurrency", "attempts", "max_get_bytes"):
            validate.integer(name, getattr(self, name), low=1, high=validate.MAX_COUNT)
        for name in ("gap_bytes", "cache_bytes", "part_bytes"):
            validate.integer(name, getattr(self, name), low=0, high=validate.MAX_COUNT)
        ahead = self.readahead_bytes
        if not (isinstance(ahead, str) and ahead == "auto"):
            if not validate.is_integer(ahead):
                msg = ("`readahead_bytes` must be an integer >= 0 or 'auto'. Received: "
                       f"readahead_bytes={ahead!r:.80} of type {type(ahead).__name__}.")
                raise (ValueError if isinstance(ahead, str) else TypeError)(msg)
            ahead = validate.integer("readahead_bytes", ahead, low=0, high=validate.MAX_COUNT)
            object.__setattr__(self, "readahead_bytes", ahead)
        for name in ("timeout", "deadline", "backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                msg = f"`{name}` must be a number of seconds >= 0. Received: {name}={value!r}."
                raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class Storage:
    """Where a file source's bytes live and how they are read: the ``storage=`` of
    `TFRecordSource`, `ArrayRecordSource` and `FileSource`.

    Guarantees: nothing here changes which bytes a source reads, so nothing here is an
    order field: a checkpoint restores under any storage options (other credentials,
    more concurrency, another cache folder). `identity` chooses what identifies the
    objects in a checkpoint: their versions where they are, or their bytes anywhere.

    Attributes:
        options: keyword arguments of the objects' fsspec filesystem, e.g.
            ``{"endpoint_url": ..., "key": ..., "secret": ...}`` for s3fs or
            ``{"project": ..., "token": ...}`` for gcsfs (credentials and endpoints
            come from the standard environment otherwise). Kept as sorted pairs.
        reads: how objects are read: retries, concurrency, merging, the in-memory
            span cache and read-ahead (`ObjectReads`).
        cache_dir: the local folder for what is kept on disk — TFRecord offset
            indexes (``tfrecord-index/``), local copies of objects
            (``objects/``), the versions of objects seen — by default
            ``$RESUMELOADER_CACHE_DIR``, else ``~/.cache/resumeloader``.
        copies_bytes: the most bytes of local copies of objects kept in
            ``cache_dir`` (ArrayRecord reads objects from local copies; least
            recently used removed first), 8 GiB by default.
        identity: what identifies the data in a checkpoint besides the files' names,
            sizes and record layouts. ``"versions"`` (the default): each object's
            version (ETag, generation) where it is stored; a checkpoint restores onto
            those objects only. ``"content"``: each file's whole bytes (a digest,
            computed once per version and kept in `cache_dir`: the first build reads
            every byte); a checkpoint restores onto the same bytes at any location —
            another bucket, a local mirror, another protocol — and is refused, naming
            the file where this machine knows it, when the bytes differ. A checkpoint
            saved with versions restores onto a source identified by content after
            the names, sizes and record layouts match (a warning says so).

    Examples:
        >>> Storage(options={"anon": True}, reads=ObjectReads(concurrency=32)).options
        (('anon', True),)
    """

    options: Mapping[str, Any] | tuple[tuple[str, Any], ...] = ()
    reads: ObjectReads = ObjectReads()
    cache_dir: str | os.PathLike[str] | None = None
    copies_bytes: int = COPIES_BYTES
    identity: str = "versions"

    def __post_init__(self) -> None:
        options = self.options
        if isinstance(options, Mapping):
            options = tuple(sorted((str(k), v) for k, v in options.items()))
        elif not (isinstance(options, tuple) and all(
            isinstance(pair, tuple) and len(pair) == 2 for pair in options
        )):
            msg = (
                "`options` must be a mapping of the filesystem's keyword arguments. "
                f"Received: options={options!r:.80} of type {type(options).__name__}."
            )
            raise TypeError(msg)
        object.__setattr__(self, "options", options)
        if not isinstance(self.reads, ObjectReads):
            msg = (
                "`reads` must be an ObjectReads. Received: "
                f"reads={self.reads!r:.80} of type {type(self.reads).__name__}."
            )
            raise TypeError(msg)
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        validate.integer("copies_bytes", self.copies_bytes, low=0, high=validate.MAX_COUNT)
        if self.identity not in IDENTITIES:
            msg = (
                f"`identity` must be one of {', '.join(map(repr, IDENTITIES))}. "
                f"Received: identity={self.identity!r:.80}."
            )
            raise ValueError(msg)

    @property
    def pairs(self) -> tuple[tuple[str, Any], ...]:
        """`options` as the sorted pairs it is kept as."""
        return self.options  # type: ignore[return-value]  # a tuple after __post_init__

    @property
    def folder(self) -> str:
        """`cache_dir`, or the default folder (`cache_root`)."""
        return str(self.cache_dir) if self.cache_dir is not None else cache_root()

    def under(self, name: str) -> str:
        """The folder `name` of `folder` (e.g. ``objects``)."""
        return os.path.join(self.folder, name)


def given(storage: Storage | None, owner: str, *, stacklevel: int = 3, **old: Any) -> Storage:
    """The `Storage` a source was given, from ``storage=`` or from the keywords of 0.3
    (``storage_options``, ``object_reads``, ``cache_dir``, ``cache_bytes``), which still
    work with a `DeprecationWarning` naming the new spelling.

    Raises:
        TypeError: `storage` is not a `Storage`, or is given with an old keyword.
    """
    if storage is not None and not isinstance(storage, Storage):
        msg = (
            f"`storage` must be a resumeloader.sources.Storage. Received: {storage!r:.80} "
            f"of type {type(storage).__name__}."
        )
        raise TypeError(msg)
    used = {k: v for k, v in old.items() if v is not None}
    if not used:
        return storage if storage is not None else Storage()
    if storage is not None:
        msg = (
            f"{owner} takes `storage=Storage(...)` or the old keywords {sorted(used)}, not "
            "both: put them in the Storage value."
        )
        raise TypeError(msg)
    spelling = {
        "storage_options": "options", "object_reads": "reads", "cache_dir": "cache_dir",
        "cache_bytes": "copies_bytes",
    }
    new = ", ".join(f"{spelling[k]}=..." for k in sorted(used))
    warnings.warn(
        f"{owner}({', '.join(f'{k}=' for k in sorted(used))}) is deprecated: pass "
        f"storage=Storage({new}) (resumeloader.sources.Storage).",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return Storage(**{spelling[k]: v for k, v in used.items()})
