"""Sampled content digests of in-memory columns: an identity for the state, not a checksum.

`columns_digest` hashes (BLAKE2b, 16 bytes) every column's kind, dtype and shape and
a fixed-size sample of its content:

* a numeric array: `NUMERIC_SAMPLE` (65,536) elements at evenly spaced positions of
  its C-order flattening, the first and the last included (every element when it
  has fewer);
* a column of strings: `ROW_SAMPLE` (1,024) evenly spaced rows, each row's length
  and its first 256 bytes;
* a ragged column (one array per record): `ROW_SAMPLE` evenly spaced records, each
  one's shape and 16 evenly spaced elements.

So its cost does not grow with the data (about 2 ms for a 1 GiB array, measured),
and it tells apart any two datasets that differ in a sampled element, in a dtype or
in a shape; two arrays that differ only between sampled positions (say one edited
record of a million) have the same digest. Pure NumPy, no copy of a column.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["ALGORITHM", "NUMERIC_SAMPLE", "ROW_SAMPLE", "columns_digest"]

#: Names the sampling rule; part of the digest, so a new rule never collides.
ALGORITHM = "sampled-v1"
NUMERIC_SAMPLE = 1 << 16
ROW_SAMPLE = 1 << 10
_STRING_PREFIX = 256
_RAGGED_ELEMENTS = 16


def _positions(count: int, sample: int) -> np.ndarray:
    if count <= sample:
        return np.arange(count, dtype=np.int64)
    return np.linspace(0, count - 1, sample).astype(np.int64)


def _numeric(hasher: hashlib.blake2b, array: np.ndarray, sample: int) -> None:
    hasher.update(f"{array.dtype.str}{array.shape}".encode())
    positions = _positions(array.size, sample)
    # The same elements either way; a contiguous array's flat view is indexed directly
    # (``flat[...]`` took 0.3 s of CPU on a fresh 2 GiB array, the view 20 ms).
    flat = array.reshape(-1) if array.flags.c_contiguous else array.flat
    hasher.update(np.ascontiguousarray(flat[positions]).tobytes())


def _strings(hasher: hashlib.blake2b, array: np.ndarray) -> None:
    hasher.update(f"strings{array.shape}".encode())
    for value in array.flat[_positions(array.size, ROW_SAMPLE)].tolist():
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        hasher.update(len(data).to_bytes(8, "little") + data[:_STRING_PREFIX])


def _ragged(hasher: hashlib.blake2b, rows: Sequence[np.ndarray]) -> None:
    hasher.update(f"ragged{len(rows)}".encode())
    for position in _positions(len(rows), ROW_SAMPLE).tolist():
        row = rows[position]
        if row.dtype == object:
            _strings(hasher, row)
        else:
            _numeric(hasher, row, _RAGGED_ELEMENTS)


def columns_digest(columns: Sequence[np.ndarray | Sequence[np.ndarray]]) -> str:
    """``"sampled-v1:<32 hex digits>"``: the sampled digest of `columns` (see module)."""
    hasher = hashlib.blake2b(digest_size=16, person=b"rl-columns")
    for column in columns:
        if not isinstance(column, np.ndarray):
            _ragged(hasher, column)
        elif column.dtype == object:
            _strings(hasher, column)
        else:
            _numeric(hasher, column, NUMERIC_SAMPLE)
    return f"{ALGORITHM}:{hasher.hexdigest()}"
