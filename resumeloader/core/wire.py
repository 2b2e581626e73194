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
every string element (string leaves only) — then the values: every record's elements
in row-major order, as raw bytes of the leaf's dtype, or the strings concatenated.
The words are little-endian; the format never leaves the machine that wrote it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = ["Ragged", "decode", "encode"]

_WORD = np.dtype("<i8")
_BYTE = np.dtype(np.uint8)

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
    if leaf.is_string:
        items = _strings(column, leaf)
        words += map(len, items)
        values = np.frombuffer(b"".join(items), dtype=_BYTE)
    elif column:
        flat = [np.asarray(value, dtype=leaf.dtype).ravel() for value in column]
        values = np.concatenate(flat).view(_BYTE)
    else:
        values = np.empty(0, _BYTE)
    header = np.array([len(words), *words], dtype=_WORD).view(_BYTE)
    return np.concatenate([header, values])


def decode(buffer: np.ndarray, leaf: spec_lib.LeafSpec) -> np.ndarray | Ragged:
    """The batch `encode` wrote: an array ``[n, *shape]`` (an object array of bytes for
    strings) when no dimension varies, else `Ragged` parts."""
    buffer = np.asarray(buffer, dtype=_BYTE)
    count = int(buffer[:8].view(_WORD)[0])
    words = buffer[8 : 8 * (count + 1)].view(_WORD)
    payload = buffer[8 * (count + 1) :]
    num_records, rank = int(words[0]), len(leaf.shape)
    used = 1 + (num_records * rank if leaf.ragged else 0)
    if leaf.is_string:
        ends = np.cumsum(words[used:]).tolist()
        starts = [0, *ends[:-1]][: len(ends)]
        blob = payload.tobytes()
        values = np.empty(len(ends), dtype=spec_lib.STRING)
        values[:] = [blob[start:end] for start, end in zip(starts, ends, strict=True)]
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
