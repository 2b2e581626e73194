"""The batch wire format: a variable-length column of a batch as one flat uint8 array.

Batches travel from the producer (the calling thread, a thread or a process worker)
to TensorFlow as fixed-shape numeric arrays, one per leaf; process workers transport
nothing else. A column of strings, or of arrays whose shapes differ from record to
record (a *variable* leaf, `LeafSpec.variable`), is neither, so the producer encodes
it with `encode` into one 1-d uint8 array and the TensorFlow layer decodes it with
`decode` into what becomes a ``tf.string`` tensor or a ``tf.RaggedTensor``. The
encoding is the same whichever worker produced the batch, so every delivery path
hands over the same bytes.

Layout: ``k`` (one int64), then ``k`` int64 words — the number of records ``n``, the
``n * ndim`` record shapes (leaves with a ``None`` dimension only), the byte length of
every string element (string leaves only) — then zero words up to the next multiple
of 64 bytes, then the values: every record's elements in row-major order, as raw
bytes of the leaf's dtype, or the strings concatenated. A column of scalar strings
may instead be *packed* (`packed`): its words are ``n``, the ``n`` lengths and the
``n`` starts of the strings in the values, which then hold them anywhere, in any
order, with other bytes between them (a source's reads, copied in once: see
`resumeloader.sources.tfrecord`). A source that made the strings already (as bytes,
to check them) hands them along with the column (`with_strings`): `decode` then takes
them as they are instead of copying each out of the values a second time. The values start 64-byte
aligned (the array is, `resumeloader.core.buffers`), so numeric values decode to a
view TensorFlow can use in place.
The words are little-endian; the format never leaves the machine that wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from resumeloader.core import buffers
from resumeloader.core import spec as spec_lib

__all__ = ["Ragged", "StringsColumn", "decode", "encode", "packed", "with_strings"]

_WORD = np.dtype("<i8")
_BYTE = np.dtype(np.uint8)
_ALIGN = buffers.ALIGNMENT
# Strings of a batch larger than this are copied into place one by one, not joined first.
_JOIN_BYTES = 64 << 10

# What `decode` returns for a leaf with a None dimension: the flat values, and one
# partition per dimension from the first record dimension to the last None one: the
# row lengths (int64[rows]) for a None dimension, the number of rows (int64[]) for a
# fixed one.
Ragged = tuple[np.ndarray, tuple[np.ndarray, ...]]


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return _as_bytes(value.item())
    msg = f"Expected bytes or str. Received: {value!r:.80} of type {type(value).__name__}."
    raise TypeError(msg)


def _strings(column: Sequence[Any], leaf: spec_lib.LeafSpec) -> list[bytes]:
    if not leaf.shape:
        return [_as_bytes(value) for value in column]
    items = itertools.chain.from_iterable(np.asarray(v, dtype=object).ravel() for v in column)
    return [_as_bytes(item) for item in items]


def encode(column: Sequence[Any], leaf: spec_lib.LeafSpec) -> np.ndarray:
    """One batch's leaf `column` (a record's value per item) as one flat uint8 array.

    The array is written in place into recycled memory (`resumeloader.core.buffers`):
    no temporary of the batch's size is made on the way.

    Args:
        column: the records' values of a variable leaf: arrays (of the leaf's dtype
            and rank, as `spec.leaf_array` returns them), or bytes and str for a
            scalar string leaf.
        leaf: the leaf's spec; its shape and dtype are trusted (checked before).

    Raises:
        TypeError: a string leaf holds something that is not bytes or str.
    """
    words: list[int] = [len(column)]
    if leaf.ragged:
        words += itertools.chain.from_iterable(np.shape(value) for value in column)
    items: list[bytes] = []
    arrays: list[np.ndarray] = []
    if leaf.is_string:
        items = _strings(column, leaf)
        words += map(len, items)
        size = sum(words[len(words) - len(items) :])
    else:
        arrays = [np.asarray(value, dtype=leaf.dtype) for value in column]
        size = sum(a.nbytes for a in arrays)
    start = _payload_start(len(words))
    out = buffers.empty((start + size,), _BYTE)
    head = out[:start].view(_WORD)
    head[0] = len(words)
    head[1 : len(words) + 1] = words
    head[len(words) + 1 :] = 0
    payload = out[start:]
    at = 0
    if leaf.is_string:
        if size >= _JOIN_BYTES:  # no joined copy of the batch: item by item into place
            memory = payload.data
            for item in items:
                memory[at : at + len(item)] = item
                at += len(item)
        elif items:
            payload[:] = np.frombuffer(b"".join(items), dtype=_BYTE)
    else:
        values = payload.view(leaf.dtype) if size else payload
        for array in arrays:
            n = array.size
            values[at : at + n] = array.ravel()
            at += n
    return out


def packed(lengths: np.ndarray, starts: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A packed column of scalar strings (see the module docstring) whose string ``k``
    is bytes ``[starts[k], starts[k] + lengths[k])`` of `size` bytes of values: the
    array (header written, recycled memory) and its values, for the caller to fill."""
    words = 1 + 2 * len(lengths)
    start = _payload_start(words)
    out = buffers.empty((start + size,), _BYTE)
    head = out[:start].view(_WORD)
    head[0] = words
    head[1] = len(lengths)
    head[2 : 2 + len(lengths)] = lengths
    head[2 + len(lengths) : words + 1] = starts
    head[words + 1 :] = 0
    return out, out[start:]


class StringsColumn(np.ndarray):
    """A packed column (`packed`) that carries its strings already made, as bytes in
    record order (`strings`): `decode` hands them over as they are. Only the array
    `with_strings` returns carries them: its views, copies and pickles (a process
    worker's batch) do not, and are decoded from their bytes."""

    strings: list[bytes] | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.strings = None


def with_strings(column: np.ndarray, strings: list[bytes]) -> np.ndarray:
    """`column` (a packed column of scalar strings) carrying `strings`, its strings in
    order as bytes, each exactly the bytes `decode` would copy out of it (the caller
    made them from the same bytes, e.g. to check them)."""
    out = column.view(StringsColumn)
    out.strings = strings
    return out


def _payload_start(count: int) -> int:
    """Where the values start: after ``count + 1`` words, rounded up to `_ALIGN` bytes
    (so that decoded numeric values are aligned as TensorFlow needs to use them in place)."""
    return -(-(count + 1) * _WORD.itemsize // _ALIGN) * _ALIGN


def decode(buffer: np.ndarray, leaf: spec_lib.LeafSpec) -> np.ndarray | Ragged:
    """The batch `encode` wrote: an array ``[n, *shape]`` (an object array of bytes for
    strings) when no dimension varies, else `Ragged` parts; a column that carries its
    strings (`with_strings`) gives them as they are."""
    made = getattr(buffer, "strings", None)
    if made is not None and leaf.is_string and not leaf.shape:
        values = np.empty(len(made), dtype=spec_lib.STRING)
        values[:] = made
        return values
    buffer = np.asarray(buffer, dtype=_BYTE)
    count = int(buffer[:8].view(_WORD)[0])
    words = buffer[8 : 8 * (count + 1)].view(_WORD)
    payload = buffer[_payload_start(count) :]
    num_records, rank = int(words[0]), len(leaf.shape)
    used = 1 + (num_records * rank if leaf.ragged else 0)
    if leaf.is_string:
        sizes = words[used:]
        if not leaf.shape and len(sizes) == 2 * num_records:  # packed
            starts = sizes[num_records:].tolist()
            ends = (sizes[num_records:] + sizes[:num_records]).tolist()
        else:
            ends = np.cumsum(sizes).tolist()
            starts = [0, *ends[:-1]][: len(ends)]
        memory = payload.data  # each string copied out once, not the whole blob
        values = np.empty(len(ends), dtype=spec_lib.STRING)
        values[:] = [memory[start:end].tobytes() for start, end in zip(starts, ends, strict=True)]
    else:
        values = payload.view(leaf.dtype)
    if not leaf.ragged:
        return values.reshape(num_records, *leaf.shape)
    shapes = words[1:used].reshape(num_records, rank)
    return _partitions(values, shapes, leaf.shape)


def _partitions(values: np.ndarray, shapes: np.ndarray, dims: tuple[int | None, ...]) -> Ragged:
    last = max(i for i, dim in enumerate(dims) if dim is None)
    rows = np.ones(len(shapes), dtype=np.int64)  # rows of each record at the current depth
    parts = []
    for i in range(last + 1):
        if dims[i] is None:
            parts.append(np.repeat(shapes[:, i], rows))
        else:
            parts.append(np.array(rows.sum(), dtype=np.int64))
        rows = rows * shapes[:, i]
    inner = tuple(int(d) for d in dims[last + 1 :])  # type: ignore[arg-type]
    # `rows` now counts each record's innermost rows (-1 cannot be inferred for size 0).
    return values.reshape(int(rows.sum()), *inner), tuple(parts)
