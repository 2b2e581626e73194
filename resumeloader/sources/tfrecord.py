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

import os
import struct
from concurrent import futures
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base, handles
from resumeloader.sources import files as files_lib
from resumeloader.sources import tfrecord_index as index_lib
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
    ) -> None:
        files = files_lib.expand_paths(paths, "TFRecord")
        folder = os.fspath(index_dir) if index_dir is not None else index_lib.default_dir()
        with futures.ThreadPoolExecutor(min(8, len(files))) as pool:
            indexes = list(pool.map(lambda path: index_lib.load_or_build(path, folder), files))
        self._indexes = indexes
        self._paths = files
        self._verify = bool(verify_checksums)
        counts = np.array([len(ix.offsets) for ix in indexes], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self.description = files_lib.describe("TFRecordSource", files)
        self._fields: dict[str, int | str] = {
            "num_records": int(self._ends[-1]),
            **files_lib.identity(files, [f"{ix.size}:{ix.digest}" for ix in indexes]),
            "identity": files_lib.content_identity([ix.head for ix in indexes]),
        }

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
        order = np.lexsort((starts, files))
        out: list[bytes] = [b""] * len(indices)
        group: list[int] = []
        for position in order.tolist():
            if group and not self._joins(group, position, files, starts, stops):
                self._read_group(group, files, numbers, starts, stops, out)
                group = []
            group.append(position)
        if group:
            self._read_group(group, files, numbers, starts, stops, out)
        return out

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
            index = int(self._starts[file] + numbers[group[0]])
            msg = f"Record index {index}: {err}"
            raise CorruptRecordError(msg, record_index=index) from err
        for position in group:
            at, stop = int(starts[position]) - begin, int(stops[position]) - begin
            try:
                out[position] = self._record(buffer, at, stop, file, int(numbers[position]), begin)
            except _Corrupt as err:
                index = int(self._starts[file] + numbers[position])
                msg = f"Record index {index}: {err}"
                raise CorruptRecordError(msg, record_index=index) from None

    def _record(
        self, buffer: bytes, at: int, stop: int, file: int, number: int, begin: int
    ) -> bytes:
        path = files_lib.display(self._indexes[file].path)
        where = f"{path}, record {number} (byte offset {begin + at})"
        if stop > len(buffer):
            msg = f"{where}: the file is shorter than when it was indexed (it changed)."
            raise _Corrupt(msg)
        length, length_crc = _LENGTH.unpack_from(buffer, at)
        if length != stop - at - 16:
            msg = (
                f"{where}: its length field says {length} bytes, the index {stop - at - 16}: "
                "the file changed since it was indexed, or the byte is corrupt."
            )
            raise _Corrupt(msg)
        data = buffer[at + 12 : stop - 4]
        if self._verify:
            if index_lib.masked_crc(buffer[at : at + 8]) != length_crc:
                msg = f"{where}: the length field fails its CRC32C checksum (corrupt data)."
                raise _Corrupt(msg)
            if index_lib.masked_crc(data) != _CRC.unpack_from(buffer, stop - 4)[0]:
                msg = f"{where}: the record's data fails its CRC32C checksum (corrupt data)."
                raise _Corrupt(msg)
        return data
