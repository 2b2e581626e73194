"""`ArrayRecordSource`: ArrayRecord files (the `array-record` package, an optional extra).

ArrayRecord keeps an index of its records in each file's footer, so any record can
be read directly; records compressed in groups of one are read without decompressing
their neighbours. A batch is read with one ``ArrayRecordReader.read(indices)`` call
per file it touches (the reader reads them in parallel). Readers are opened when a
read needs them, through the process's bounded cache of open files
(`resumeloader.sources.handles`). Records are the stored bytes (typically serialized
``tf.train.Example``): parse and decode them in TensorFlow with `Pipeline.tf_map`.

Objects in storage (``s3://``, ``gs://``, ...) are read from local copies of whole
objects (`resumeloader.sources.object_cache`: the reader opens local paths only),
kept by version in a bounded folder: the first record read from an object costs
the whole object.

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

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base, fetch, handles, object_cache, storage
from resumeloader.sources import files as files_lib

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


def _ends_digest(path: str) -> tuple[handles.Stamp, str]:
    """The file's stamp, and a hash of its first and last 64 KiB: the first records and
    the footer's index."""
    with handles.opened(path) as file:
        head = file.pread(_EDGE_BYTES, 0)
        tail = file.pread(_EDGE_BYTES, max(0, file.size - _EDGE_BYTES))
        stamp = (file.size, file.mtime_ns)
    return stamp, hashlib.blake2b(head + tail, digest_size=8).hexdigest()


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
                f"{files_lib.display(path)} changed since the source was built: it had "
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
        f"{files_lib.display(path)} is not a readable ArrayRecord file (truncated or "
        f"corrupt): the reader says {why}."
    )
    raise ValueError(msg) from why


class ArrayRecordSource(base.Source):
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
        storage_options: keyword arguments of the objects' fsspec filesystem.
        object_reads: how objects are read (`ObjectReads`: retries, concurrency).
        cache_dir: where local copies of objects are kept (default: the
            ``objects`` folder of ``$RESUMELOADER_CACHE_DIR``, else of
            ``~/.cache/resumeloader``).
        cache_bytes: the most bytes of copies kept there (8 GiB by default).

    Raises:
        ImportError: the `array-record` package is not installed.
        ValueError: a file is not a readable ArrayRecord file (truncated or
            corrupt; the message names it), or was written with a group size other
            than 1: every random read would decompress its whole group (rewrite it
            with ``group_size:1``).
    """

    def __init__(
        self,
        paths: files_lib.Paths,
        *,
        reader_options: str = READER_OPTIONS,
        storage_options: storage.Options | None = None,
        object_reads: fetch.ObjectReads | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = object_cache.DEFAULT_BYTES,
    ) -> None:
        _module()  # the ImportError now, not at the first read
        self._locations = files_lib.expand_locations(paths, "ArrayRecord", storage_options)
        self._names = [files_lib.name_of(location) for location in self._locations]
        self._reads = object_reads if object_reads is not None else fetch.ObjectReads()
        self._cache_dir = os.fspath(cache_dir) if cache_dir else object_cache.default_dir()
        self._cache_bytes = int(cache_bytes)
        self._options = reader_options
        counts, sizes, tails, stamps = [], [], [], []
        for file in range(len(self._locations)):
            path = self._local(file)
            what = files_lib.display(self._names[file])
            reader = handles.CACHE.open(functools.partial(_reader, path, reader_options), what)
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
                counts.append(reader.num_records())
            finally:
                reader.close()
            stamp, tail = _ends_digest(path)
            remote = isinstance(self._locations[file], storage.Object)
            stamps.append(None if remote else stamp)  # a copy is pinned by its version
            sizes.append(stamp[0])
            tails.append(tail)
        self._stamps = stamps
        self._ends = np.cumsum(np.array(counts, dtype=np.int64))
        self._starts = self._ends - np.array(counts, dtype=np.int64)
        self.description = files_lib.describe("ArrayRecordSource", self._names)
        contents = [f"{s}:{c}:{t}" for s, c, t in zip(sizes, counts, tails, strict=True)]
        self._fields: dict[str, int | str] = {
            "num_records": len(self),
            **files_lib.identity(self._names, contents),
        }
        self._mean_bytes = sum(sizes) / max(1, len(self))
        if any(isinstance(loc, storage.Object) for loc in self._locations):
            self._fields["versions"] = files_lib.versions_digest(self._locations)
            files_lib.remember_versions(self._cache_dir, self._locations)

    def explain_field(self, field: str, saved: int | str) -> str | None:
        if field != "versions":
            return None
        return files_lib.changed_versions(self._cache_dir, str(saved), self._locations)

    def _local(self, file: int) -> str:
        """The local path of file `file` (an object's local copy, downloaded if needed)."""
        location = self._locations[file]
        if isinstance(location, storage.Object):
            return object_cache.local_copy(
                location, self._cache_dir, self._reads, max_bytes=self._cache_bytes
            )
        return location

    def mean_record_bytes(self) -> float:
        """The files' bytes per record."""
        return self._mean_bytes

    @property
    def prefetches(self) -> bool:
        return any(isinstance(loc, storage.Object) for loc in self._locations)

    def prefetch(self, indices: np.ndarray) -> bool:
        """Starts downloading the objects that `indices` read and the folder lacks."""
        files = np.unique(np.searchsorted(self._ends, np.asarray(indices), side="right"))
        for file in files.tolist():
            location = self._locations[file]
            if isinstance(location, storage.Object):
                object_cache.prefetch(
                    location, self._cache_dir, self._reads, max_bytes=self._cache_bytes
                )
        return True

    def records_per_file(self) -> list[int] | None:
        """How many records each file holds, in order."""
        return (self._ends - self._starts).tolist()

    def __len__(self) -> int:
        return int(self._ends[-1])

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of(b"")

    def record_key(self, index: int) -> dict[str, Any]:
        """The record's index, its file and its number in that file."""
        return self.record_keys(np.asarray([index], dtype=np.int64))[0]

    def record_keys(self, indices: np.ndarray) -> list[dict[str, Any]]:
        """`record_key` of each of `indices`."""
        return files_lib.record_keys(self._names, self._starts, self._ends, indices)

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    @property
    def batched(self) -> bool:
        return True

    @property
    def reads_many(self) -> bool:
        return True

    def read(self, index: int) -> bytes:
        return self.read_batch(np.array([index], dtype=np.int64))[0]

    def read_many(self, indices: np.ndarray) -> list[Any]:
        return self.read_batch(indices)

    def read_batch(self, indices: np.ndarray) -> list[bytes]:
        """The records at `indices` (stored bytes), in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            msg = f"Record indices must lie in [0, {len(self)}). Received: {indices.tolist()}."
            raise IndexError(msg)
        files = np.searchsorted(self._ends, indices, side="right")
        local = indices - self._starts[files]
        out: list[bytes] = [b""] * len(indices)
        for file in np.unique(files).tolist():
            where = np.flatnonzero(files == file)
            records = self._read_file(file, local[where].tolist())
            for position, record in zip(where.tolist(), records, strict=True):
                out[position] = record
        return out

    def _read_file(self, file: int, numbers: list[int]) -> list[bytes]:
        """Records `numbers` of file `file`; a failure names the file and the record."""
        location, stamp = self._locations[file], self._stamps[file]
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
        except fetch.ObjectReadError as err:  # the object's copy could not be downloaded
            index = int(self._starts[file]) + numbers[0]
            msg = f"Record index {index}: {err}"
            raise base.RecordReadError(msg, record_index=index) from err
        index = int(self._starts[file]) + number
        msg = (
            f"Record index {index}: {files_lib.display(name)}, record {number}: the "
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
