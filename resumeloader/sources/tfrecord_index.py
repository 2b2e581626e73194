"""The offset index of a TFRecord file: where each record starts, built once, cached.

A TFRecord file is a sequence of records, each framed as ``length`` (uint64, little
endian), ``masked_crc32c(length)`` (uint32), ``data[length]``, ``masked_crc32c(data)``
(uint32). `build` walks the headers only: it reads each record's 12-byte header
(checking its checksum) and seeks past the body; small records are read in windows
of many headers at once. The index is the int64 offset of every record; a record's
length follows from the next offset (or the file's size).

An index is stored as a compact binary file (a 128-byte header, then 8 bytes per
record) in a cache directory, and reused while the data file's size, modification
time and a hash of its first 64 KiB match; otherwise it is rebuilt. A stored index
is not trusted: loading reads it whole (8 bytes per record, kept in memory; no
descriptor stays open) and checks its offsets against the hash in its header and
against the file (increasing, each record's frame inside the file); an index that
fails is rebuilt. Every file is opened through `resumeloader.sources.storage.handles`.

"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import struct
import tempfile
import warnings
from typing import Any

import google_crc32c
import numpy as np

from resumeloader.sources.storage import handles, locations, objects, options

__all__ = [
    "FOLDER",
    "HEAD_BYTES",
    "FileIndex",
    "build",
    "cache_path",
    "decode",
    "default_dir",
    "encode",
    "head_digest",
    "load_or_build",
    "masked_crc",
    "store",
    "walk",
]

#: The folder of `Storage.cache_dir` that holds the indexes by default.
FOLDER = "tfrecord-index"
#: How much of each file's start its head digest covers.
HEAD_BYTES = 1 << 16

_MAGIC = b"RLTFRIX1"
_HEADER = struct.Struct("<8sQQQ16s16s")  # magic, size, mtime_ns, count, head, offsets digest
_HEADER_BYTES = 128
_RECORD = struct.Struct("<QI")  # a record's length and the masked CRC of the length
_FRAME = 16  # header (12) + data CRC (4)
_WINDOW = 1 << 18  # bytes read at once while the records are small
_LARGE = 1 << 16  # from this average record size on, read only the headers


def masked_crc(data: bytes) -> int:
    """The masked CRC32C TFRecord stores (see the module docstring)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """One data file's index: its stamp and record offsets, and what identifies it."""

    path: str
    size: int
    mtime_ns: int
    offsets: np.ndarray  # int64, one per record
    digest: str  # hex digest of the offsets: the file's record layout
    head: str  # hex digest of the file's first 64 KiB: a sample of its content
    obj: objects.Object | None = None  # the object, for a file in object storage

    @property
    def stamp(self) -> handles.Stamp:
        """(size, modification time): what the file must still have when it is read."""
        return self.size, self.mtime_ns


def _offsets_digest(offsets: np.ndarray) -> bytes:
    return hashlib.blake2b(offsets.astype("<i8").tobytes(), digest_size=16).digest()


def _refuse_compressed(path: str, first: bytes) -> None:
    if first[:2] == b"\x1f\x8b":
        kind, tool = "GZIP", "gunzip"
    elif len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0:
        kind, tool = "ZLIB", "zlib.decompress"
    else:
        return
    msg = (
        f"{locations.display(path)} is a {kind}-compressed TFRecord file. Compressed files "
        "cannot be read at random positions (a record can only be found by decompressing "
        f"everything before it), so resumeloader reads uncompressed TFRecord only. Decompress "
        f"it once (e.g. `{tool}`, or tf.data.TFRecordDataset(path, compression_type='{kind}') "
        "written back with tf.io.TFRecordWriter) and pass the uncompressed files."
    )
    raise ValueError(msg)


def build(path: str) -> np.ndarray:
    """The offsets of every record of the TFRecord file `path` (int64).

    Raises:
        ValueError: the file is compressed, is not a TFRecord file, or a header is
            corrupt or points past the end of the file (the message names the file,
            the record number and its byte offset).
    """
    with handles.opened(path) as file:
        return walk(path, file)


def walk(path: str, file: Any) -> np.ndarray:
    """The record offsets of `file` (anything with ``size`` and ``pread(length, offset)``),
    named `path` in errors; see `build`."""
    offsets: list[int] = []
    size = file.size
    window, window_start, offset = b"", 0, 0
    while offset < size:
        at = offset - window_start
        if at < 0 or at + 12 > len(window):
            average = offset // len(offsets) if offsets else 0
            length = 12 if average >= _LARGE else _WINDOW
            window, window_start, at = file.pread(length, offset), offset, 0
        if len(window) - at < 12:
            _corrupt(path, len(offsets), offset, "the file ends inside a record header")
        length, crc = _RECORD.unpack_from(window, at)
        if masked_crc(window[at : at + 8]) != crc:
            if not offsets:
                _refuse_compressed(path, window[at : at + 2])
            _corrupt(path, len(offsets), offset, "its length field fails its checksum")
        if offset + length + _FRAME > size:
            _corrupt(path, len(offsets), offset, f"its length {length} runs past the end")
        offsets.append(offset)
        offset += length + _FRAME
    return np.array(offsets, dtype=np.int64)


def _corrupt(path: str, number: int, offset: int, what: str) -> None:
    msg = (
        f"{locations.display(path)} is not a valid TFRecord file: record {number} (byte "
        f"offset {offset}): {what}. Expected uncompressed TFRecord framing (length, CRC, "
        "data, CRC)."
    )
    raise ValueError(msg)


def cache_path(path: str, index_dir: str) -> str:
    """Where the index of data file `path` is stored in `index_dir`."""
    key = hashlib.blake2b(os.fsencode(os.path.abspath(path)), digest_size=8).hexdigest()
    return os.path.join(index_dir, f"{os.path.basename(path)}.{key}.rlidx")


def default_dir() -> str:
    """``$RESUMELOADER_CACHE_DIR/tfrecord-index`` or ``~/.cache/resumeloader/tfrecord-index``."""
    return os.path.join(options.cache_root(), FOLDER)


def head_digest(file: Any) -> bytes:
    """A 16-byte hash of the first `HEAD_BYTES` of `file` (anything with ``size`` and
    ``pread(length, offset)``)."""
    head = file.pread(min(file.size, HEAD_BYTES), 0)
    return hashlib.blake2b(head, digest_size=16).digest()


def _plausible(offsets: np.ndarray, size: int) -> bool:
    """Whether `offsets` can be the record starts of a file of `size` bytes."""
    if not len(offsets):
        return size == 0
    gaps = np.diff(offsets)
    return bool(offsets[0] == 0 and (gaps >= _FRAME).all() and offsets[-1] + _FRAME <= size)


def encode(offsets: np.ndarray, size: int, stamp: int, head: bytes) -> bytes:
    """The stored form of an index: a 128-byte header (the data's `size`, a `stamp` of
    its version — a file's modification time, an object's version hash — its record
    count, `head` digest and the offsets' digest), then the offsets."""
    digest = _offsets_digest(offsets)
    header = _HEADER.pack(_MAGIC, size, stamp, len(offsets), head, digest)
    return header.ljust(_HEADER_BYTES, b"\0") + offsets.astype("<i8").tobytes()


def decode(
    data: bytes, size: int, stamp: int, head: bytes | None = None
) -> tuple[np.ndarray, bytes, bytes] | None:
    """(offsets, offsets digest, head digest) of a stored index of data of `size` bytes
    and `stamp` (and `head`, when given), or None if it is another version's, foreign,
    truncated, edited or implausible."""
    try:
        magic, got_size, got_stamp, count, got_head, digest = _HEADER.unpack_from(data)
    except struct.error:
        return None
    if (magic, got_size, got_stamp) != (_MAGIC, size, stamp):
        return None
    if head is not None and got_head != head:
        return None
    if len(data) != _HEADER_BYTES + 8 * count:
        return None
    offsets = np.frombuffer(data, dtype="<i8", offset=_HEADER_BYTES).astype(np.int64)
    if _offsets_digest(offsets) != digest or not _plausible(offsets, size):
        return None
    return offsets, digest, got_head


def _load(stored: str, path: str, size: int, mtime: int, head: bytes) -> FileIndex | None:
    """The index stored at `stored` if it is the current, intact index of `path`."""
    try:
        with handles.opened(stored) as file:
            data = file.pread(file.size, 0)
    except OSError:
        return None  # missing: rebuilt
    found = decode(data, size, mtime, head)
    if found is None:
        return None  # another version, foreign, edited or corrupt: rebuilt
    offsets, digest, _ = found
    return FileIndex(path, size, mtime, offsets, digest.hex(), head.hex())


def store(stored: str, data: bytes) -> None:
    """Writes an encoded index to `stored` atomically (a warning if it cannot)."""
    folder = os.path.dirname(stored)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, stored)  # atomic: concurrent builders write the same content
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        warnings.warn(
            f"Could not store the TFRecord index {locations.display(stored)} ({err}); it is "
            "kept in memory and rebuilt by every process. Pass a writable `index_dir`.",
            stacklevel=4,
        )


def load_or_build(path: str, index_dir: str) -> FileIndex:
    """The index of `path`: loaded from `index_dir` if it is current and intact, else
    built and stored (the file is opened once, and closed before this returns)."""
    stored = cache_path(path, index_dir)
    with handles.opened(path) as file:
        size, mtime = file.size, file.mtime_ns
        head = head_digest(file)
        found = _load(stored, path, size, mtime, head)
        if found is not None:
            return found
        offsets = walk(path, file)
    store(stored, encode(offsets, size, mtime, head))
    return FileIndex(path, size, mtime, offsets, _offsets_digest(offsets).hex(), head.hex())
