"""The string tensors of a TensorFlow checkpoint, read without importing TensorFlow.

A loader's state in a ``tf.train.Checkpoint`` is a scalar string (its JSON) under a
key ending in ``/.ATTRIBUTES/py_state``. Reading it needs no TensorFlow, whose import
takes seconds and prints its start-up lines: a checkpoint (format V2) is an index
file — a sorted table in LevelDB's format mapping each tensor's key to a
``BundleEntryProto`` (dtype, shape, data file, offset, size, CRC32C) — and data
files holding the tensors' bytes. A scalar string is stored as the varint of its
length, the masked CRC32C of that length, then its bytes.

`read_strings` returns the scalar strings whose keys a predicate accepts, each
checked against its entry's CRC32C. What this reader does not know (a compressed
block, a sliced or non-scalar entry, another format) raises `UnsupportedCheckpoint`,
and the caller reads the checkpoint with TensorFlow instead. `read_index_file` reads
the ``checkpoint`` text file a ``tf.train.CheckpointManager`` keeps.
"""

from __future__ import annotations

import ast
import os
import re
import struct
from collections.abc import Callable, Iterator

import google_crc32c

__all__ = ["UnsupportedCheckpoint", "read_index_file", "read_strings"]

_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48
_TRAILER = 5  # a block's compression type and CRC
_DT_STRING = 7
_MASK_DELTA = 0xA282EAD8
_INDEX_LINE = re.compile(r'^\s*(\w+)\s*:\s*("(?:[^"\\]|\\.)*")\s*$')


class UnsupportedCheckpoint(ValueError):
    """The checkpoint uses something this reader does not read (read it with TensorFlow)."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            msg = "a varint runs past its data"
            raise UnsupportedCheckpoint(msg)
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _mask(crc: int) -> int:
    """TensorFlow's masked CRC32C (as stored in checkpoints and TFRecord files)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _scalar_string(data: bytes) -> bytes:
    """A scalar string tensor's bytes: its length, the length's checksum, the string.

    Raises:
        UnsupportedCheckpoint: the checksum of the length does not match.
    """
    length, at = _varint(data, 0)
    if length > 0xFFFFFFFF or len(data) < at + 4 + length:
        msg = "a string tensor's length does not fit its data"
        raise UnsupportedCheckpoint(msg)
    crc = google_crc32c.value(struct.pack("<I", length))
    if struct.unpack_from("<I", data, at)[0] != _mask(crc):
        msg = "a string tensor's length checksum does not match"
        raise UnsupportedCheckpoint(msg)
    return data[at + 4 : at + 4 + length]


def _checksum(data: bytes) -> int:
    """The masked CRC32C an entry stores for a scalar string tensor `data`: the length
    (as uint32, not its varint), the length's checksum, then the string's bytes."""
    length, at = _varint(data, 0)
    crc = google_crc32c.value(struct.pack("<I", length))
    crc = google_crc32c.extend(crc, data[at:])
    return _mask(crc)


def _block(data: bytes, handle: bytes) -> bytes:
    offset, at = _varint(handle, 0)
    size, _ = _varint(handle, at)
    if offset + size + _TRAILER > len(data):
        msg = "a block lies past the end of the index file"
        raise UnsupportedCheckpoint(msg)
    if data[offset + size] != 0:
        msg = "compressed table blocks"
        raise UnsupportedCheckpoint(msg)
    return data[offset : offset + size]


def _entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key, value) pairs of a table block (keys prefix-compressed)."""
    if len(block) < 4:
        msg = "a table block too short"
        raise UnsupportedCheckpoint(msg)
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    at, key = 0, b""
    while at < end:
        shared, at = _varint(block, at)
        unshared, at = _varint(block, at)
        length, at = _varint(block, at)
        key = key[:shared] + block[at : at + unshared]
        at += unshared
        yield key, block[at : at + length]
        at += length


def _fields(message: bytes) -> dict[int, list[int | bytes]]:
    """A protobuf message's fields by number (varints as ints, the rest as bytes)."""
    fields: dict[int, list[int | bytes]] = {}
    at = 0
    while at < len(message):
        tag, at = _varint(message, at)
        number, kind = tag >> 3, tag & 7
        value: int | bytes
        if kind == 0:
            value, at = _varint(message, at)
        elif kind == 2:
            length, at = _varint(message, at)
            value, at = message[at : at + length], at + length
        elif kind == 5:
            value, at = message[at : at + 4], at + 4
        elif kind == 1:
            value, at = message[at : at + 8], at + 8
        else:
            msg = f"protobuf wire type {kind}"
            raise UnsupportedCheckpoint(msg)
        fields.setdefault(number, []).append(value)
    return fields


def _table(prefix: str) -> Iterator[tuple[bytes, bytes]]:
    with open(prefix + ".index", "rb") as f:
        data = f.read()
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        msg = "not a table file (no table magic number)"
        raise UnsupportedCheckpoint(msg)
    footer = data[-_FOOTER:]
    _, at = _varint(footer, 0)
    _, at = _varint(footer, at)  # the metaindex block's handle, then the index block's
    for _, handle in _entries(_block(data, footer[at:])):
        yield from _entries(_block(data, handle))


def read_strings(prefix: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The scalar string tensors of the checkpoint `prefix` whose keys `wanted` accepts.

    Raises:
        OSError: a file of the checkpoint cannot be read.
        UnsupportedCheckpoint: the checkpoint is not one this reader reads (its data
            or CRC included): read it with TensorFlow.
    """
    entries: dict[str, dict[int, list[int | bytes]]] = {}
    num_shards = 1
    for raw_key, value in _table(prefix):
        if raw_key == b"":
            num_shards = int(_fields(value).get(1, [1])[0])
            continue
        key = raw_key.decode("utf-8", "replace")
        if wanted(key):
            entries[key] = _fields(value)
    found: dict[str, bytes] = {}
    for key, entry in entries.items():
        shape = entry.get(2, [b""])[0]
        if entry.get(1, [0])[0] != _DT_STRING or shape != b"" or 7 in entry:
            continue  # not a scalar string: no loader state
        shard = int(entry.get(3, [0])[0])
        offset = int(entry.get(4, [0])[0])
        size = int(entry.get(5, [0])[0])
        path = f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(size)
        stored = entry.get(6)
        crc = None if stored is None else struct.unpack("<I", stored[0])[0]  # type: ignore[arg-type]
        if len(data) != size or (crc is not None and _checksum(data) != crc):
            msg = f"the data of {key!r} does not match its size or CRC32C"
            raise UnsupportedCheckpoint(msg)
        found[key] = _scalar_string(data)
    return found


def _unquote(quoted: str) -> str:
    """A text-format string: C escapes, non-ASCII bytes as octal escapes of UTF-8."""
    try:
        return bytes(ast.literal_eval("b" + quoted)).decode("utf-8")
    except (SyntaxError, ValueError):  # raw non-ASCII characters in the file
        return str(ast.literal_eval(quoted))


def read_index_file(directory: str) -> str | None:
    """The newest checkpoint prefix named by `directory`'s ``checkpoint`` file (the
    text a ``tf.train.CheckpointManager`` writes), joined to `directory` when relative.

    Raises:
        ValueError: the file is not such a text.
    """
    with open(os.path.join(directory, "checkpoint"), encoding="utf-8") as f:
        text = f.read()
    newest = None
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _INDEX_LINE.match(line)
        if match is None:
            msg = f"unexpected line {line[:60]!r}"
            if not re.match(r"^\s*\w+\s*:\s*[-\d.eE+]+\s*$", line):
                raise ValueError(msg)
            continue
        if match.group(1) == "model_checkpoint_path":
            newest = _unquote(match.group(2))
    if not newest:
        return None
    return newest if os.path.isabs(newest) else os.path.join(directory, newest)
