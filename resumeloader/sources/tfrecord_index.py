"""The offset index of a TFRecord file: where each record starts, built once, memory-mapped.

A TFRecord file is a sequence of records, each framed as ``length`` (uint64, little
endian), ``masked_crc32c(length)`` (uint32), ``data[length]``, ``masked_crc32c(data)``
(uint32). `build` walks the headers only: it reads each record's 12-byte header
(checking its checksum) and seeks past the body; small records are read in windows
of many headers at once. The index is the int64 offset of every record; a record's
length follows from the next offset (or the file's size).

An index is stored as a compact binary file (a 128-byte header, then 8 bytes per
record) in a cache directory, and reused while the data file's size, modification
time and a hash of its first 64 KiB match; otherwise it is rebuilt. Loading one maps
it into memory (``np.memmap``), so a restore does not read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import tempfile
import warnings

import google_crc32c
import numpy as np

__all__ = [
    "FileIndex",
    "build",
    "cache_path",
    "default_dir",
    "load_or_build",
    "mapped",
    "masked_crc",
]

_MAGIC = b"RLTFRIX1"
_HEADER = struct.Struct("<8sQQQ16s16s")  # magic, size, mtime_ns, count, head, offsets digest
_HEADER_BYTES = 128
_HEAD_BYTES = 1 << 16
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
    """One data file's index: its size and record offsets, and what identifies it."""

    path: str
    size: int
    offsets: np.ndarray  # int64, one per record
    digest: str  # hex digest of the offsets: the file's record layout
    stored: str | None  # the index file it was mapped from, None when kept in memory


def _head_digest(fd: int, size: int) -> bytes:
    return hashlib.blake2b(os.pread(fd, min(size, _HEAD_BYTES), 0), digest_size=16).digest()


def _refuse_compressed(path: str, first: bytes) -> None:
    if first[:2] == b"\x1f\x8b":
        kind, tool = "GZIP", "gunzip"
    elif len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0:
        kind, tool = "ZLIB", "zlib.decompress"
    else:
        return
    msg = (
        f"{path} is a {kind}-compressed TFRecord file. Compressed files cannot be read at "
        "random positions (a record can only be found by decompressing everything before "
        f"it), so resumeloader reads uncompressed TFRecord only. Decompress it once (e.g. "
        f"`{tool}`, or tf.data.TFRecordDataset(path, compression_type='{kind}') written back "
        "with tf.io.TFRecordWriter) and pass the uncompressed files."
    )
    raise ValueError(msg)


def build(path: str) -> np.ndarray:
    """The offsets of every record of the TFRecord file `path` (int64).

    Raises:
        ValueError: the file is compressed, is not a TFRecord file, or a header is
            corrupt or points past the end of the file (the message names the file,
            the record number and its byte offset).
    """
    offsets: list[int] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        window, window_start, offset = b"", 0, 0
        while offset < size:
            at = offset - window_start
            if at < 0 or at + 12 > len(window):
                average = offset // len(offsets) if offsets else 0
                length = 12 if average >= _LARGE else _WINDOW
                window, window_start, at = os.pread(fd, length, offset), offset, 0
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
    finally:
        os.close(fd)
    return np.array(offsets, dtype=np.int64)


def _corrupt(path: str, number: int, offset: int, what: str) -> None:
    msg = (
        f"{path} is not a valid TFRecord file: record {number} (byte offset {offset}): "
        f"{what}. Expected uncompressed TFRecord framing (length, CRC, data, CRC)."
    )
    raise ValueError(msg)


def cache_path(path: str, index_dir: str) -> str:
    """Where the index of data file `path` is stored in `index_dir`."""
    key = hashlib.blake2b(os.path.abspath(path).encode(), digest_size=8).hexdigest()
    return os.path.join(index_dir, f"{os.path.basename(path)}.{key}.rlidx")


def default_dir() -> str:
    """``$RESUMELOADER_CACHE_DIR/tfrecord-index`` or ``~/.cache/resumeloader/tfrecord-index``."""
    root = os.environ.get("RESUMELOADER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "resumeloader"
    )
    return os.path.join(root, "tfrecord-index")


def _load(stored: str, path: str, size: int, mtime: int, head: bytes) -> FileIndex | None:
    try:
        with open(stored, "rb") as f:
            header = f.read(_HEADER.size)
        magic, got_size, got_mtime, count, got_head, digest = _HEADER.unpack(header)
        if (magic, got_size, got_mtime, got_head) != (_MAGIC, size, mtime, head):
            return None
        if os.path.getsize(stored) != _HEADER_BYTES + 8 * count:
            return None
        offsets = mapped(stored, count)
    except (OSError, struct.error, ValueError):
        return None  # missing, truncated or foreign: rebuilt
    return FileIndex(path, size, offsets, digest.hex(), stored)


def mapped(stored: str, count: int | None = None) -> np.ndarray:
    """The offsets of the index file `stored`, memory-mapped (read-only)."""
    if count is None:
        count = (os.path.getsize(stored) - _HEADER_BYTES) // 8
    if not count:
        return np.empty(0, np.int64)
    return np.memmap(stored, dtype="<i8", mode="r", offset=_HEADER_BYTES, shape=(count,))


def _store(stored: str, offsets: np.ndarray, header: bytes) -> bool:
    try:
        os.makedirs(os.path.dirname(stored), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(stored), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(header.ljust(_HEADER_BYTES, b"\0"))
            f.write(offsets.astype("<i8").tobytes())
        os.replace(tmp, stored)  # atomic: concurrent builders write the same content
    except OSError as err:
        warnings.warn(
            f"Could not store the TFRecord index {stored} ({err}); it is kept in memory and "
            "rebuilt by every process. Pass a writable `index_dir`.",
            stacklevel=4,
        )
        return False
    return True


def load_or_build(path: str, index_dir: str) -> FileIndex:
    """The index of `path`: mapped from `index_dir` if it is current, else built and stored."""
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = os.fstat(fd)
        head = _head_digest(fd, stat.st_size)
    finally:
        os.close(fd)
    stored = cache_path(path, index_dir)
    found = _load(stored, path, stat.st_size, stat.st_mtime_ns, head)
    if found is not None:
        return found
    offsets = build(path)
    digest = hashlib.blake2b(offsets.astype("<i8").tobytes(), digest_size=16).digest()
    header = _HEADER.pack(_MAGIC, stat.st_size, stat.st_mtime_ns, len(offsets), head, digest)
    if _store(stored, offsets, header):
        mapped = _load(stored, path, stat.st_size, stat.st_mtime_ns, head)
        if mapped is not None:
            return mapped
    return FileIndex(path, stat.st_size, offsets, digest.hex(), None)
