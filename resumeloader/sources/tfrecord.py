"""`TFRecordSource`: random access to uncompressed TFRecord files, without TensorFlow.

TensorFlow reads TFRecord only sequentially. This source indexes every file once
(`resumeloader.sources.tfrecord_index`: record offsets, built from the 12-byte
headers, cached) and reads any batch of records with ranged reads through the
process's bounded cache of open files (`resumeloader.sources.handles`: any number
of files under any ``ulimit -n``): the batch's records sorted by file and offset,
neighbours coalesced into one read, returned in the requested order, each checked
against its CRC32C checksums. Records
are the serialized bytes (typically ``tf.train.Example``): parse and decode them in
TensorFlow with `Pipeline.tf_map`.
"""

from __future__ import annotations

import copy
import os
import struct
from concurrent import futures
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base, fetch, handles, remote_index, storage
from resumeloader.sources import files as files_lib
from resumeloader.sources import tfrecord_index as index_lib
from resumeloader.sources import tfrecord_objects as objects_lib
from resumeloader.sources.base import CorruptRecordError

__all__ = ["CorruptRecordError", "TFRecordSource"]

_LENGTH = struct.Struct("<QI")
_CRC = struct.Struct("<I")
# Records of one file closer than this are read with one pread (the gap is read too).
_GAP = 1 << 14
_MAX_READ = 1 << 22


class _Corrupt(Exception):
    pass


class TFRecordSource(base.Source):
    """Uncompressed TFRecord files as a random-access source of serialized records (bytes).

    Guarantees: record ``i`` is the ``i``-th record of the files in the order given
    (a glob is sorted), every time, in every process. The files' names, sizes,
    record layouts and a hash of each file's first 64 KiB are order fields: a
    checkpoint of other files is refused, naming what differs (regenerated files
    with the same names and record sizes included, unless they differ only past
    their first 64 KiB). A file that changes after it was indexed is refused when
    it is opened again (`CorruptRecordError`), never read as other bytes. Every read
    checks the record's CRC32C checksums (length and data; about 1 µs per 3 KB
    record) unless `verify_checksums` is False; a corrupt record raises
    `CorruptRecordError` (a `RecordError` by the time it reaches you) naming the
    file, the record's number in it and its byte offset.

    Args:
        paths: a file, a glob pattern, or a list of files and patterns (a path
            naming an existing file is that file, glob characters and all).
        index_dir: where the offset indexes are kept (default: the
            ``tfrecord-index`` folder of ``$RESUMELOADER_CACHE_DIR``, else of
            ``~/.cache/resumeloader``). An index is rebuilt when its file's size,
            modification time or first 64 KiB change, or when it fails its checks.
        verify_checksums: check each record's CRC32C when it is read.

    Raises:
        FileNotFoundError: a file or pattern names nothing.
        ValueError: a file is GZIP or ZLIB compressed (no random access: decompress
            it once), or is not a valid TFRecord file.

    Examples:
        >>> import os, tempfile, tensorflow as tf
        >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
        >>> with tf.io.TFRecordWriter(path) as writer:
        ...     for word in (b"a", b"bb", b"ccc"):
        ...         writer.write(word)
        >>> source = TFRecordSource(path, index_dir=tempfile.mkdtemp())
        >>> len(source), source.read(2), source.read_batch(np.array([1, 0]))
        (3, b'ccc', [b'bb', b'a'])
    """

    def __init__(
        self,
        paths: files_lib.Paths,
        *,
        index_dir: str | os.PathLike[str] | None = None,
        verify_checksums: bool = True,
        storage_options: storage.Options | None = None,
        object_reads: fetch.ObjectReads | None = None,
    ) -> None:
        locations = files_lib.expand_locations(paths, "TFRecord", storage_options)
        folder = os.fspath(index_dir) if index_dir is not None else index_lib.default_dir()
        reads = object_reads if object_reads is not None else fetch.ObjectReads()
        if not isinstance(reads, fetch.ObjectReads):
            msg = (
                "`object_reads` must be an ObjectReads. Received: "
                f"object_reads={object_reads!r} of type {type(object_reads).__name__}."
            )
            raise TypeError(msg)
        self._reads = reads

        def index(location: files_lib.Location) -> index_lib.FileIndex:
            if isinstance(location, storage.Object):
                return remote_index.load_or_build(location, folder, reads)
            return index_lib.load_or_build(location, folder)

        with futures.ThreadPoolExecutor(min(8, len(locations))) as pool:
            indexes = list(pool.map(index, locations))
        self._indexes = indexes
        self._verify = bool(verify_checksums)
        counts = np.array([len(ix.offsets) for ix in indexes], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self._remote = np.array([ix.obj is not None for ix in indexes])
        #: Records per block of aligned reads (`blocked`), or None.
        self.block_records: int | None = None
        self._blocks: objects_lib.Blocks | None = None
        names = [files_lib.name_of(location) for location in locations]
        self._paths = names  # for lineage (`record_keys`)
        self.description = files_lib.describe("TFRecordSource", names)
        self._fields: dict[str, int | str] = {
            "num_records": int(self._ends[-1]),
            **files_lib.identity(names, [f"{ix.size}:{ix.digest}" for ix in indexes]),
            "identity": files_lib.content_identity([ix.head for ix in indexes]),
        }
        self._locations, self._index_dir = locations, folder
        if self._remote.any():  # objects: each one's version
            self._fields["versions"] = files_lib.versions_digest(locations)
            files_lib.remember_versions(folder, locations)

    def __len__(self) -> int:
        return int(self._ends[-1])

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of(b"")

    def record_key(self, index: int) -> dict[str, Any]:
        """The record's index, its file and its number in that file."""
        return self.record_keys(np.asarray([index], dtype=np.int64))[0]

    def record_keys(self, indices: np.ndarray) -> list[dict[str, Any]]:
        """`record_key` of each of `indices`."""
        return files_lib.record_keys(self._paths, self._starts, self._ends, indices)

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
        """The records at `indices` (serialized bytes), in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            msg = f"Record indices must lie in [0, {len(self)}). Received: {indices.tolist()}."
            raise IndexError(msg)
        files, numbers, starts, stops, remote = self._locate(indices)
        order = np.lexsort((starts, files))
        out: list[bytes] = [b""] * len(indices)
        if remote.any():
            self._read_objects(np.flatnonzero(remote), files, numbers, starts, stops, out)
            order = order[~remote[order]]
        for group in self._groups(order, files, starts, stops):
            self._read_group(group, files, numbers, starts, stops, out)
        return out

    def _locate(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        """The file, number in it, byte range and remoteness of each record of `indices`."""
        files = np.searchsorted(self._ends, indices, side="right")
        numbers = indices - self._starts[files]
        starts = np.empty(len(indices), dtype=np.int64)
        stops = np.empty(len(indices), dtype=np.int64)
        for file in np.unique(files).tolist():
            ix, mine = self._indexes[file], files == file
            local = numbers[mine]
            starts[mine] = ix.offsets[local]
            # A record ends where the next one starts, the last one at the end of the file.
            following = np.minimum(local + 1, len(ix.offsets) - 1)
            stops[mine] = np.where(local + 1 == len(ix.offsets), ix.size, ix.offsets[following])
        return files, numbers, starts, stops, self._remote[files]

    @classmethod
    def _groups(
        cls, order: np.ndarray, files: np.ndarray, starts: np.ndarray, stops: np.ndarray
    ) -> list[list[int]]:
        """The positions of local records in `order`, cut into groups read by one pread."""
        groups: list[list[int]] = []
        for position in order.tolist():
            if groups and cls._joins(groups[-1], position, files, starts, stops):
                groups[-1].append(position)
            else:
                groups.append([position])
        return groups

    def dry_read(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the preads and GETs that ``read_batch(indices)`` makes."""
        indices = np.asarray(indices, dtype=np.int64)
        files, _, starts, stops, remote = self._locate(indices)
        at = np.flatnonzero(remote).tolist()
        if at:
            ranges = [(self._indexes[files[p]].obj, int(starts[p]), int(stops[p])) for p in at]
            dry.read(ranges, self._reads, blocks=self._blocks)
        order = np.lexsort((starts, files))
        begins, ends, numbers = starts.tolist(), stops.tolist(), files.tolist()
        for group in self._groups(order[~remote[order]], files, starts, stops):
            wanted = sum(ends[p] - begins[p] for p in group)
            path = self._indexes[numbers[group[0]]].path
            dry.pread(path, begins[group[0]], max(ends[p] for p in group), wanted=wanted)
        return True

    @staticmethod
    def _joins(
        group: list[int], position: int, files: np.ndarray, starts: np.ndarray, stops: np.ndarray
    ) -> bool:
        first, last = group[0], group[-1]
        return bool(
            files[position] == files[first]
            and starts[position] - stops[last] <= _GAP
            and stops[position] - starts[first] <= _MAX_READ
        )

    def _read_group(
        self,
        group: list[int],
        files: np.ndarray,
        numbers: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        out: list[bytes],
    ) -> None:
        file = int(files[group[0]])
        begin = int(starts[group[0]])
        end = max(int(stops[p]) for p in group)
        ix = self._indexes[file]
        try:
            buffer = handles.pread(ix.path, end - begin, begin, stamp=ix.stamp)
        except handles.StaleFileError as err:
            raise self._bad(file, numbers[group[0]], err) from err
        for position in group:
            at, stop = int(starts[position]) - begin, int(stops[position]) - begin
            try:
                out[position] = self._record(buffer, at, stop, file, int(numbers[position]), begin)
            except _Corrupt as err:
                raise self._bad(file, numbers[position], err) from None

    def _bad(
        self,
        file: Any,
        number: Any,
        err: BaseException,
        kind: type[CorruptRecordError | base.RecordReadError] = CorruptRecordError,
    ) -> CorruptRecordError | base.RecordReadError:
        """The error of `kind` naming the source index of record `number` of `file`."""
        index = int(self._starts[int(file)] + number)
        return kind(f"Record index {index}: {err}", record_index=index)

    def _read_objects(
        self,
        positions: np.ndarray,
        files: np.ndarray,
        numbers: np.ndarray,
        starts: np.ndarray,
        stops: np.ndarray,
        out: list[bytes],
    ) -> None:
        """The records at `positions` that live in objects: every GET of the batch at once
        (`resumeloader.sources.fetch`), each record checked as a local one."""
        at = positions.tolist()
        ranges = [(self._indexes[files[p]].obj, int(starts[p]), int(stops[p])) for p in at]
        try:
            views = fetch.read(ranges, self._reads, blocks=self._blocks)
        except (fetch.ObjectChangedError, fetch.ObjectReadError) as err:
            paths = [self._indexes[files[p]].path for p in at]
            p = objects_lib.failing(err, at, paths, starts, stops)
            changed = isinstance(err, fetch.ObjectChangedError)
            kind = CorruptRecordError if changed else base.RecordReadError
            raise self._bad(files[p], numbers[p], err, kind) from err
        for p, view in zip(at, views, strict=True):
            file, number, begin = int(files[p]), int(numbers[p]), int(starts[p])
            try:
                out[p] = self._record(bytes(view), 0, len(view), file, number, begin)
            except _Corrupt as err:
                raise self._bad(file, number, err) from None

    # -- object storage: the block order, read-ahead, what changed ----------------------
    def blocked(self, block_records: int | None) -> TFRecordSource:
        """This source reading objects a block at a time: a record's GET reads its whole
        block of `block_records` consecutive records (the block order's chunk), kept in
        the process's cache for the other records of the block. The records are the
        same; only how objects are read changes."""
        view = copy.copy(self)
        view.block_records = None if block_records is None else int(block_records)
        view._blocks = None
        if block_records is not None:
            view._blocks = objects_lib.Blocks(self._indexes, self._starts, int(block_records))
        return view

    def explain_field(self, field: str, saved: int | str) -> str | None:
        if field != "versions":
            return None
        return files_lib.changed_versions(self._index_dir, str(saved), self._locations)

    def mean_record_bytes(self) -> float:
        """The files' bytes per record (framing included)."""
        return sum(ix.size for ix in self._indexes) / max(1, len(self))

    def records_per_file(self) -> list[int] | None:
        """How many records each file holds, in order."""
        return (self._ends - self._starts).tolist()

    @property
    def prefetches(self) -> bool:
        return bool(self._remote.any())

    def prefetch(self, indices: np.ndarray) -> bool:
        """Starts reading the objects' bytes of `indices` (see `fetch.prefetch`); False
        when the read-ahead budget is full."""
        ranges = self._object_ranges(indices)
        return not ranges or fetch.prefetch(ranges, self._reads, blocks=self._blocks)

    def dry_prefetch(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the GETs that ``prefetch(indices)`` starts."""
        ranges = self._object_ranges(indices)
        return not ranges or dry.prefetch(ranges, self._reads, blocks=self._blocks)

    def _object_ranges(self, indices: np.ndarray) -> list[fetch.Range]:
        """The byte ranges of the records of `indices` that lie in object storage."""
        indices = np.asarray(indices, dtype=np.int64)
        files = np.searchsorted(self._ends, indices, side="right")
        mine = self._remote[files]
        if not mine.any():
            return []
        return objects_lib.ranges(self._indexes, self._starts, files[mine], indices[mine])

    def _record(
        self, buffer: bytes, at: int, stop: int, file: int, number: int, begin: int
    ) -> bytes:
        problem = None
        if stop > len(buffer):
            problem = "the file is shorter than when it was indexed (it changed)."
        else:
            length, length_crc = _LENGTH.unpack_from(buffer, at)
            data = buffer[at + 12 : stop - 4]
            if length != stop - at - 16:
                problem = (
                    f"its length field says {length} bytes, the index {stop - at - 16}: "
                    "the file changed since it was indexed, or the byte is corrupt."
                )
            elif self._verify and index_lib.masked_crc(buffer[at : at + 8]) != length_crc:
                problem = "the length field fails its CRC32C checksum (corrupt data)."
            elif self._verify and index_lib.masked_crc(data) != _CRC.unpack_from(
                buffer, stop - 4
            )[0]:
                problem = "the record's data fails its CRC32C checksum (corrupt data)."
        if problem is not None:  # the message is built only for a bad record
            path = files_lib.display(self._indexes[file].path)
            raise _Corrupt(f"{path}, record {number} (byte offset {begin + at}): {problem}")
        return data
