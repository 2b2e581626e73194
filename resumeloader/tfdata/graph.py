"""The TensorFlow side of a loader: element specs and position arithmetic in a graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import positions
from resumeloader.core import spec as spec_lib

__all__ = ["advance", "element_spec", "record_spec", "spec_text"]


def element_spec(spec: spec_lib.RecordSpec, batch_dim: int | None, with_metadata: bool) -> Any:
    """The structure of `tf.TensorSpec` of one batch of records described by `spec`."""
    specs = [
        tf.TensorSpec((batch_dim, *leaf.shape), tf.as_dtype(leaf.dtype)) for leaf in spec.leaves
    ]
    data = optree.tree_unflatten(spec.treespec, specs)
    if not with_metadata:
        return data
    meta = {k: tf.TensorSpec((batch_dim,), tf.int64) for k in ("index", "epoch", "position")}
    meta["seed"] = tf.TensorSpec((batch_dim, 2), tf.int64)
    return data, meta


def advance(variable: tf.Variable, layout: positions.Layout, num_batches: Any) -> None:
    """Advances the position `variable` by `num_batches` batches with tensor ops."""
    per_epoch = tf.constant(layout.records_per_epoch, tf.int64)
    size = tf.constant(layout.batch_size, tf.int64)
    end = layout.end

    def one_batch(position: tf.Tensor) -> tf.Tensor:
        # Mirrors positions.Layout.batch_end + normalise with tensor ops.
        position += tf.minimum(size, per_epoch - position % per_epoch)
        if layout.drop_remainder:
            offset = position % per_epoch
            left = per_epoch - offset
            position += tf.where((offset > 0) & (left < size), left, tf.zeros_like(left))
        if end is not None:
            position = tf.minimum(position, tf.constant(end, tf.int64))
        return position

    position = variable.read_value()
    count = tf.cast(num_batches, tf.int64)
    _, position = tf.while_loop(
        lambda i, _: i < count,
        lambda i, p: (i + 1, one_batch(p)),
        (tf.constant(0, tf.int64), position),
    )
    variable.assign(position)


def record_spec(output_signature: Any) -> spec_lib.RecordSpec:
    """The per-record spec described by a structure of `tf.TensorSpec`."""
    leaves, treespec = optree.tree_flatten(
        output_signature, is_leaf=lambda x: isinstance(x, tf.TensorSpec), none_is_leaf=True
    )
    if not leaves or not all(isinstance(leaf, tf.TensorSpec) for leaf in leaves):
        msg = (
            "`output_signature` must be a structure of tf.TensorSpec describing one record. "
            f"Received: output_signature={output_signature!r}."
        )
        raise TypeError(msg)
    specs = tuple(
        spec_lib.LeafSpec(tuple(leaf.shape.as_list()), np.dtype(leaf.dtype.as_numpy_dtype))
        for leaf in leaves
    )
    return spec_lib.RecordSpec(treespec, specs)


def spec_text(spec: Any) -> str:
    """A structure of `tf.TensorSpec` in words, e.g. ``{x: float32[None,3]}``."""

    def leaf(s: Any) -> str:
        dims = ",".join("None" if d is None else str(d) for d in s.shape.as_list())
        return f"{s.dtype.name}[{dims}]"

    text = str(optree.tree_map(leaf, spec, none_is_leaf=True))
    return text.replace("'", "")
