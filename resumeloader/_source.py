"""Random-access data sources: the protocol and the adapters the loader reads through.

A source is anything with ``len()`` and ``__getitem__(int)``. NumPy arrays, and dicts
or tuples of equal-length arrays (columns), are read a whole batch at a time with
one fancy-index. A source may also offer ``read_batch(indices)`` returning the
records of an int64 index array already stacked (a leading batch dimension); the
loader uses it whenever there is no per-record ``map_fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import optree

__all__ = ["RandomAccessSource", "adapt"]


@runtime_checkable
class RandomAccessSource(Protocol):
    """What the loader needs of a source: a length and integer indexing.

    ``source[i]`` must return the same record every time it is called with the same
    ``i`` (the loader re-reads records after a restore); it may be called from a
    thread that is not the main thread, and with ``worker_type="process"`` from a
    worker process that received the source pickled once.

    Batched access (optional): a source may also define ``read_batch(indices)``,
    taking an int64 NumPy array of record indices and returning those records
    stacked, with a leading dimension of ``len(indices)`` on every leaf and the
    same structure as one record (e.g. one database query or one ``pread`` per
    batch). The loader calls it once per batch instead of ``source[i]`` per record
    whenever there is no ``map_fn``, and checks the result against the element
    spec. NumPy arrays and dicts or tuples of equal-length arrays are read this way
    already.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class Adapter:
    """Uniform access to a source: its length, one record, optionally a whole batch."""

    def __init__(
        self,
        num_records: int,
        read: Callable[[int], Any],
        read_batch: Callable[[np.ndarray], Any] | None,
        description: str,
    ) -> None:
        self.num_records = num_records
        self.read = read
        self.read_batch = read_batch
        self.description = description


def _is_columns(source: Any) -> bool:
    if isinstance(source, np.ndarray):
        return True
    if isinstance(source, (dict, tuple)) and source:
        leaves: list[Any] = optree.tree_leaves(source, none_is_leaf=True)  # type: ignore[arg-type]
        return bool(leaves) and all(isinstance(leaf, np.ndarray) for leaf in leaves)
    return False


def _columns(source: Any) -> Adapter:
    leaves = optree.tree_leaves(source, none_is_leaf=True)
    lengths = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
    if None in lengths:
        msg = "Every array of an array `source` needs a leading record dimension; got a 0-d array."
        raise ValueError(msg)
    if len(lengths) != 1:
        shapes = optree.tree_map(lambda a: a.shape, source)
        msg = (
            f"The arrays of `source` must have equal lengths. Received shapes: {shapes}."
        )
        raise ValueError(msg)

    def read(index: int) -> Any:
        return optree.tree_map(lambda a: a[index], source)

    def read_batch(indices: np.ndarray) -> Any:
        return optree.tree_map(lambda a: a[indices], source)

    kind = type(source).__name__
    return Adapter(int(leaves[0].shape[0]), read, read_batch, f"{kind} of arrays")


def adapt(source: Any) -> Adapter:
    """Wraps `source` for the loader, checking that it is a non-empty random-access source.

    Raises:
        TypeError: `source` has no ``len()`` or no ``__getitem__``.
        ValueError: `source` is empty, or its arrays have different lengths.
    """
    if _is_columns(source):
        adapter = _columns(source)
    elif isinstance(source, RandomAccessSource) and not isinstance(source, (str, bytes)):
        read_batch = getattr(source, "read_batch", None)
        adapter = Adapter(
            len(source),
            source.__getitem__,
            read_batch if callable(read_batch) else None,
            type(source).__name__,
        )
    else:
        msg = (
            "`source` must be a NumPy array, a dict or tuple of equal-length arrays, or an "
            "object with `__len__` and `__getitem__(int)`. "
            f"Received: source of type {type(source).__name__}."
        )
        raise TypeError(msg)
    if adapter.num_records < 1:
        msg = (
            "`source` must hold at least one record. "
            f"Received: len(source)={adapter.num_records}."
        )
        raise ValueError(msg)
    return adapter
