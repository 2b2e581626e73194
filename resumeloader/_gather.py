"""In-memory array sources without a ``map_fn``: batches gathered inside tf.data.

For such sources Python only computes each batch's record indices; the records are
gathered from constant tensors by ``tf.gather`` in TensorFlow's threads, which costs
much less per batch than converting a NumPy batch in ``from_generator``. The stream
is identical to the generic path: the same tasks, cut the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader import _batching, _source

__all__ = ["Gatherer"]

# The arrays are copied once into constant tensors; above this size the copy of the
# whole source is not worth the per-batch saving, and the generic path is used.
MAX_BYTES = 1 << 30
_KINDS = "biuf"  # bool, signed, unsigned, float


def _is_spec(x: Any) -> bool:
    return isinstance(x, tf.TensorSpec)


class Gatherer:
    """Builds the gather pipeline of an array source; see `create`."""

    def __init__(self, leaves: list[np.ndarray], treespec: Any) -> None:
        self._leaves = leaves
        self._treespec = treespec
        self._columns: list[tf.Tensor] | None = None

    @classmethod
    def create(
        cls, source: Any, *, map_fn: Any, num_workers: int, spec: _batching.RecordSpec
    ) -> Gatherer | None:
        """A gatherer when `source` is numeric arrays matching `spec`, without ``map_fn``
        or workers and at most MAX_BYTES; else None (the generic path applies)."""
        if map_fn is not None or num_workers or not _source._is_columns(source):
            return None
        leaves, treespec = optree.tree_flatten(source, none_is_leaf=True)
        if treespec != spec.treespec or sum(leaf.nbytes for leaf in leaves) > MAX_BYTES:
            return None
        if not all(
            leaf.dtype.kind in _KINDS and want.accepts(leaf[0])
            for leaf, want in zip(leaves, spec.leaves, strict=True)
        ):
            return None
        return cls(leaves, treespec)

    def dataset(
        self,
        indices: Callable[[], Iterator[Any]],
        element_spec: Any,
        *,
        with_metadata: bool,
    ) -> tf.data.Dataset:
        """Batches gathered at the index arrays that `indices()` yields.

        Args:
            indices: a generator function yielding an int64 index array per batch, or
                ``(indices, metadata)`` when `with_metadata`.
            element_spec: the loader's element spec, which the batches are given.
            with_metadata: whether elements are ``(batch, metadata)``.
        """
        if self._columns is None:
            with tf.init_scope():
                self._columns = [tf.constant(np.ascontiguousarray(a)) for a in self._leaves]
        columns = self._columns
        data_spec = element_spec[0] if with_metadata else element_spec
        specs = optree.tree_leaves(data_spec, is_leaf=_is_spec, none_is_leaf=True)
        index_spec = tf.TensorSpec(specs[0].shape[:1], tf.int64)
        signature = (index_spec, element_spec[1]) if with_metadata else index_spec
        treespec = self._treespec

        def gather(index: tf.Tensor) -> Any:
            batch = [
                tf.ensure_shape(tf.gather(column, index), spec.shape)
                for column, spec in zip(columns, specs, strict=True)
            ]
            return optree.tree_unflatten(treespec, batch)

        ds = tf.data.Dataset.from_generator(indices, output_signature=signature)
        if with_metadata:
            return ds.map(lambda index, meta: (gather(index), meta))
        return ds.map(gather)
