"""`ArrayRecordSource`: ArrayRecord files (the `array-record` package, an optional extra).

ArrayRecord keeps an index of its records in each file's footer, so any record can
be read directly; records compressed in groups of one are read without decompressing
their neighbours. A batch is read with one ``ArrayRecordReader.read(indices)`` call
per file it touches (the reader reads them in parallel). Readers are opened when a
read needs them, through the process's bounded cache of open files
(`resumeloader.sources.storage.handles`). Records are the stored bytes (typically
serialized ``tf.train.Example``): parse and decode them in TensorFlow with
`Pipeline.tf_map`.

Objects in storage (``s3://``, ``gs://``, ...) are read from local copies of whole
objects (`resumeloader.sources.storage.object_cache`: the reader opens local paths
only), kept by version in a bounded folder: the first record read from an object
costs the whole object.

Errors of the reader (a truncated or corrupt file) never surface bare: a file that
cannot be opened is a `ValueError` naming it when the source is built, a record that
cannot be read a `CorruptRecordError` naming the file and the record (the reader's
error chained), which reaches you as that record's `RecordError`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
from typing import Any

import numpy as np

from resumeloader.sources import base, file_records
from resumeloader.sources.storage import (
    answers,
    fetch,
    handles,
    locations,
    object_cache,
    objects,
    options,
)

__all__ = ["ArrayRecordSource"]

# Random access: no read-ahead (see ArrayRecordReader's documentation).
READER_OPTIONS = "readahead_buffer_size:0"
_EDGE_BYTES = 1 << 16


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as err:
        msg = (
            "ArrayRecordSource needs the `array-record` package: "
            'pip install array-record (the `arrayrecord` extra: pip install -e '
            '".[arrayrecord]" in a checkout of resumeloader).'
        )
        raise ImportError(msg) from err
    return array_record_module


def _group_size(options: str) -> int:
    for option in options.split(","):
        key, _, value = option.partition(":")
        if key.strip() == "group_size":
            return int(value)
    return 65536  # array-record's default when a writer was not told


def _ends_digest(path: str) -> tuple[int, str]:
    """The file's size, and a hash of its first and last 64 KiB: the first records and
    the footer's index."""
    with handles.opened(path) as file:
        head = file.pread(_EDGE_BYTES, 0)
        tail = file.pread(_EDGE_BYTES, max(0, file.size - _EDGE_BYTES))
        size = file.size
    return size, hashlib.blake2b(head + tail, digest_size=8).hexdigest()


def _reader(path: str, options: str, stamp: handles.Stamp | None = None) -> Any:
    """An open `ArrayRecordReader` of `path`.

    Raises:
        StaleFileError: the file is not the one `stamp` describes.
        TooManyOpenFiles: (through the cache) no descriptor is left.
        ValueError: the file is not a readable ArrayRecord file (truncated, corrupt).
    """
    if stamp is not None:
        stat = os.stat(path)
        if (stat.st_size, stat.st_mtime_ns) != stamp:
            msg = (
                f"{locations.display(path)} changed since the source was built: it had "
                f"{stamp[0]} bytes, it has {stat.st_size}. Build the source again."
            )
            raise handles.StaleFileError(errno.ESTALE, msg)
    reader = _module().ArrayRecordReader(path, options)
    if reader.ok():
        return reader
    try:
        reader.read_all()  # says why it is not ok
        why: Exception | None = None
    except Exception as err:  # the reader raises RuntimeError with riegeli's status
        why = err
    with contextlib.suppress(Exception):  # a failed reader's close raises its status again
        reader.close()
    if why is not None and "Too many open files" in str(why):
        raise OSError(errno.EMFILE, str(why))
    msg = (
        f"{locations.display(path)} is not a readable ArrayRecord file (truncated or "
        f"corrupt): the reader says {why}."
    )
    raise ValueError(msg) from why


class ArrayRecordSource(file_records.FileRecordSource):
    """ArrayRecord files as a random-access source of stored records (bytes).

    Guarantees: record ``i`` is the ``i``-th record of the files in the order given (a
    glob is sorted), in every process; the files' names, sizes, record counts and
    footers are order fields, so a checkpoint of other files is refused.

    Args:
        paths: a file, a glob pattern, or a list of files and patterns; or URLs of
            objects (``s3://``, ``gs://``, ``http(s)://``, ``memory://``) and their
            patterns.
        reader_options: the ``ArrayRecordReader`` options (default: no read-ahead,
            for random access).
        storage: where objects are and how they are read (`Storage`: filesystem
            options, retries, concurrency; the folder of local copies,
            ``cache_dir``, and its bound, ``copies_bytes``: 8 GiB by default).
        storage_options: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(options=...)``.
        object_reads: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(reads=...)``.
        cache_dir: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(cache_dir=...)``.
        cache_bytes: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(copies_bytes=...)``.

    Raises:
        ImportError: the `array-record` package is not installed.
        ValueError: a file is not a readable ArrayRecord file (truncated or
            corrupt; the message names it), or was written with a group size other
            than 1: every random read would decompress its whole group (rewrite it
            with ``group_size:1``); or every file is empty.
    """

    kind = "ArrayRecord"

    def __init__(
        self,
        paths: locations.Paths,
        *,
        reader_options: str = READER_OPTIONS,
        storage: options.Storage | None = None,
        storage_options: Any = None,
        object_reads: Any = None,
        cache_dir: Any = None,
        cache_bytes: Any = None,
    ) -> None:
        _module()  # the ImportError now, not at the first read
        storage = options.given(
            storage, "ArrayRecordSource", storage_options=storage_options,
            object_reads=object_reads, cache_dir=cache_dir, cache_bytes=cache_bytes,
        )
        self._options = reader_options
        super().__init__(paths, storage=storage)
        if not self._remote.any():
            base.without(self, "prefetch")  # nothing to download ahead

    def _layout(self, file: int) -> file_records.Layout:
        path = self._local(file)
        what = locations.display(self._names[file])
        reader = handles.CACHE.open(functools.partial(_reader, path, self._options), what)
        try:
            written = reader.writer_options_string()
            group = _group_size(written)
            if group != 1:
                msg = (
                    f"{what} was written with group_size:{group}: its records are "
                    f"compressed in groups of {group}, so each random read would "
                    f"decompress {group} records. Rewrite it with "
                    "ArrayRecordWriter(path, 'group_size:1') for random access. "
                    f"Received writer options: {written!r}."
                )
                raise ValueError(msg)
            count = reader.num_records()
        finally:
            reader.close()
        size, tail = _ends_digest(path)
        return file_records.Layout(count, f"{size}:{count}:{tail}")

    def _stamp(self, file: int) -> handles.Stamp | None:
        """What a local file must still be when read (an object's copy is pinned by its
        version)."""
        location = self._locations[file]
        return location.stamp if isinstance(location, locations.LocalFile) else None

    def _local(self, file: int) -> str:
        """The local path of file `file` (an object's local copy, downloaded if needed)."""
        location = self._locations[file]
        if isinstance(location, objects.Object):
            return object_cache.local_copy(location, self._storage)
        return location.path

    def prefetch(self, indices: np.ndarray) -> bool:
        """Starts downloading the objects that `indices` read and the folder lacks.
        (Only a source with objects has it.)"""
        files = np.unique(np.searchsorted(self._ends, np.asarray(indices), side="right"))
        for file in files.tolist():
            location = self._locations[file]
            if isinstance(location, objects.Object):
                object_cache.prefetch(location, self._storage)
        return True

    def _read(self, files: np.ndarray, numbers: np.ndarray) -> list[bytes]:
        out: list[bytes] = [b""] * len(files)
        for file in np.unique(files).tolist():
            where = np.flatnonzero(files == file)
            records = self._read_file(file, numbers[where].tolist())
            for position, record in zip(where.tolist(), records, strict=True):
                out[position] = record
        return out

    def _read_file(self, file: int, numbers: list[int]) -> list[bytes]:
        """Records `numbers` of file `file`; a failure names the file and the record."""
        location, stamp = self._locations[file], self._stamp(file)
        name = self._names[file]
        key = ("array_record", name, getattr(location, "version", None), self._options, stamp)
        try:
            with handles.CACHE.use(
                key, lambda: _reader(self._local(file), self._options, stamp), _close, repr(name)
            ) as reader:
                try:
                    return list(reader.read(numbers))
                except Exception as err:  # riegeli's RuntimeError: find the record
                    number = next((n for n in numbers if not _readable(reader, n)), numbers[0])
                    cause: Exception = err
        except (handles.StaleFileError, ValueError) as err:
            number, cause = numbers[0], err
        except (fetch.ObjectReadError, answers.Refusal) as err:  # the copy was not downloaded
            raise self._failed(file, numbers[0], err) from err
        index = int(self._starts[file]) + number
        msg = (
            f"Record index {index}: {locations.display(name)}, record {number}: the "
            f"ArrayRecord reader failed ({type(cause).__name__}: {cause})."
        )
        raise base.CorruptRecordError(msg, record_index=index) from cause


def _readable(reader: Any, number: int) -> bool:
    try:
        reader.read([number])
    except Exception:
        return False
    return True


def _close(reader: Any) -> None:
    reader.close()
