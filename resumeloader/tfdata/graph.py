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
    """Advances the position `variable` by `num_batches` batches with O(1) tensor ops.

    The same arithmetic as `positions.Layout.advance` (no loop over batches). A
    negative `num_batches`, or an endless stream passing 2**63 - 1 records, fails the
    step with ``InvalidArgumentError`` instead of storing a wrong position.
    """
    per_epoch = tf.constant(layout.records_per_epoch, tf.int64)
    size = tf.constant(layout.batch_size, tf.int64)
    count = tf.cast(num_batches, tf.int64)
    checks = [
        tf.debugging.assert_non_negative(
            count, message="`num_batches` of loader.advance() must be >= 0"
        )
    ]
    position = variable.read_value()
    offset = position % per_epoch
    if layout.drop_remainder:  # normalise: a position in a dropped remainder moves on
        left_in_epoch = per_epoch - offset
        moved = (offset > 0) & (left_in_epoch < size)
        position += tf.where(moved, left_in_epoch, tf.zeros_like(left_in_epoch))
        offset = position % per_epoch
    full, rest = (per_epoch - offset) // size, (per_epoch - offset) % size
    left = full + (0 if layout.drop_remainder else tf.cast(rest > 0, tf.int64))
    left = tf.maximum(left, 1)  # a normalised position before the end starts a batch
    within = position + tf.minimum(count, left) * size
    epochs = tf.maximum(count - left, 0) // layout.batches_per_epoch
    batches = tf.maximum(count - left, 0) % layout.batches_per_epoch
    epoch = position // per_epoch + 1
    if layout.num_epochs is not None:
        # Clamped before multiplying, so that no count can overflow.
        epoch = tf.minimum(epoch + tf.minimum(epochs, layout.num_epochs), layout.num_epochs)
    else:
        limit = (positions.MAX_POSITION - batches * size) // per_epoch
        checks.append(
            tf.debugging.Assert(
                (count < left) | (epochs <= limit - epoch),
                ["loader.advance(num_batches) would pass the largest position, 2**63 - 1."],
            )
        )
        epoch += epochs
    beyond = epoch * per_epoch + batches * size
    advanced = tf.where(count < left, within, beyond)
    if layout.end is not None:
        advanced = tf.minimum(advanced, layout.end)
    with tf.control_dependencies(checks):
        variable.assign(advanced)


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
