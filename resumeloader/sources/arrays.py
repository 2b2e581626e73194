"""In-memory columns: a NumPy array, or a dict or tuple of equal-length arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from resumeloader.sources import base

__all__ = ["ArraySource"]


class ArraySource(base.Source):
    """Records are rows of equal-length arrays; a batch is one fancy-index per array.

    Args:
        arrays: a NumPy array, or a dict or tuple (possibly nested) of NumPy arrays
            sharing their leading dimension.
    """

    def __init__(self, arrays: Any) -> None:
        leaves, treespec = optree.tree_flatten(arrays, none_is_leaf=True)
        lengths = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if None in lengths:
            msg = (
                "Every array of an array `source` needs a leading record dimension; got a "
                "0-d array."
            )
            raise ValueError(msg)
        if len(lengths) != 1:
            shapes = optree.tree_map(lambda a: a.shape, arrays)
            msg = f"The arrays of `source` must have equal lengths. Received shapes: {shapes}."
            raise ValueError(msg)
        self._arrays = arrays
        self._leaves = leaves
        self._treespec = treespec
        self._length = int(leaves[0].shape[0])
        self.description = f"{type(arrays).__name__} of arrays"

    @staticmethod
    def accepts(source: Any) -> bool:
        """A NumPy array, or a non-empty dict or tuple whose every leaf is one."""
        if isinstance(source, np.ndarray):
            return True
        if isinstance(source, (dict, tuple)) and source:
            leaves: list[Any] = optree.tree_leaves(source, none_is_leaf=True)  # type: ignore[arg-type]
            return bool(leaves) and all(isinstance(leaf, np.ndarray) for leaf in leaves)
        return False

    def __len__(self) -> int:
        return self._length

    def read(self, index: int) -> Any:
        return optree.tree_map(lambda a: a[index], self._arrays)

    @property
    def batched(self) -> bool:
        return True

    def read_batch(self, indices: np.ndarray) -> Any:
        return optree.tree_map(lambda a: a[indices], self._arrays)

    def columns(self) -> tuple[list[np.ndarray], Any] | None:
        return self._leaves, self._treespec
