"""The structure and per-leaf dtype and shape of one record (NumPy and optree only)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import optree

__all__ = ["LeafSpec", "RecordSpec", "flatten"]


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Shape (without the batch dimension; None where it may vary) and dtype of a leaf."""

    shape: tuple[int | None, ...]
    dtype: np.dtype

    def accepts(self, array: np.ndarray) -> bool:
        """Whether `array` (one record's leaf) has this dtype and a compatible shape."""
        if array.dtype != self.dtype or array.ndim != len(self.shape):
            return False
        pairs = zip(self.shape, array.shape, strict=True)
        return all(want is None or want == got for want, got in pairs)


@dataclasses.dataclass(frozen=True)
class RecordSpec:
    """The structure of one record and the spec of each of its leaves."""

    treespec: Any
    leaves: tuple[LeafSpec, ...]

    @classmethod
    def of(cls, record: Any) -> RecordSpec:
        """The spec of one record (its structure and each leaf's dtype and shape)."""
        leaves, treespec = flatten(record)
        return cls(treespec, tuple(LeafSpec(a.shape, a.dtype) for a in leaves))

    def describe(self) -> str:
        """The spec in words, e.g. ``{image: uint8[32, 32, 3], label: int64[]}``."""
        parts = [f"{s.dtype.name}{list(s.shape)}" for s in self.leaves]
        return str(optree.tree_unflatten(self.treespec, parts)).replace("'", "")


def flatten(record: Any) -> tuple[list[np.ndarray], Any]:
    """A record's leaves as arrays and its structure.

    Raises:
        TypeError: a leaf is not an array, number, string or bytes.
    """
    leaves, treespec = optree.tree_flatten(record, none_is_leaf=True)
    arrays = [np.asarray(leaf) for leaf in leaves]
    for leaf, array in zip(leaves, arrays, strict=True):
        if array.dtype == object:
            msg = (
                "Record leaves must be arrays, numbers, strings or bytes. "
                f"Received a leaf of type {type(leaf).__name__}: {leaf!r:.80}."
            )
            raise TypeError(msg)
    return arrays, treespec
