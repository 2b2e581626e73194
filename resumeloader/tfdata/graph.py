"""The TensorFlow side of a loader's batches: element specs and variable leaves.

A produced batch (NumPy, variable leaves in the batch wire format) reaches TensorFlow
in two steps: `decode` (NumPy, in the generator's thread) and `assemble` (tensor ops,
eagerly or inside tf.data), which builds each ragged leaf from its parts.
"""

from __future__ import annotations

from typing import Any

import optree
import tensorflow as tf
from tensorflow.python.framework import config as _tf_config

from resumeloader.core import spec as spec_lib
from resumeloader.core import wire

__all__ = [
    "assemble",
    "decode",
    "element_spec",
    "leaf_spec",
    "metadata_spec",
    "parallel_map",
    "spec_text",
    "wire_spec",
]


def parallel_map() -> dict[str, Any]:
    """The arguments of the loader's parallel maps: ``num_parallel_calls=AUTOTUNE`` in
    order (``deterministic=True``), or none (a sequential map) while op determinism is on.

    Under ``tf.config.experimental.enable_op_determinism()`` TensorFlow 2.21 rewrites a
    parallel map into a sequential one anyway, and the rewrite logs an error for every
    iterator ("NodeDef mentions attribute use_unbounded_threadpool which is not in the
    op definition"): built sequential, the same map runs without it.
    """
    enabled = getattr(_tf_config, "is_op_determinism_enabled", None)
    if enabled is not None and enabled():
        return {}
    return {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}


def leaf_spec(leaf: spec_lib.LeafSpec, batch_dim: int | None) -> tf.TypeSpec:
    """The `tf.TypeSpec` of a batch of one leaf: a `tf.RaggedTensorSpec` when it varies."""
    dtype = tf.string if leaf.is_string else tf.as_dtype(leaf.dtype)
    shape = (batch_dim, *leaf.shape)
    if not leaf.ragged:
        return tf.TensorSpec(shape, dtype)
    rank = _ragged_rank(leaf)
    return tf.RaggedTensorSpec(shape, dtype, ragged_rank=rank, row_splits_dtype=tf.int64)


def metadata_spec(batch_dim: int | None) -> dict[str, tf.TensorSpec]:
    """The spec of a batch's per-record metadata (`resumeloader.core.rng.metadata`)."""
    meta = {k: tf.TensorSpec((batch_dim,), tf.int64) for k in ("index", "epoch", "position")}
    meta["seed"] = tf.TensorSpec((batch_dim, 2), tf.int64)
    return meta


def element_spec(spec: spec_lib.RecordSpec, batch_dim: int | None, with_metadata: bool) -> Any:
    """The structure of `tf.TypeSpec` of one batch of records described by `spec`."""
    data = optree.tree_unflatten(spec.treespec, [leaf_spec(x, batch_dim) for x in spec.leaves])
    return (data, metadata_spec(batch_dim)) if with_metadata else data


def _ragged_rank(leaf: spec_lib.LeafSpec) -> int:
    return 1 + max(i for i, dim in enumerate(leaf.shape) if dim is None)


def wire_spec(spec: spec_lib.RecordSpec, batch_dim: int | None) -> Any:
    """The spec of a batch as `decode` hands it to TensorFlow: a ragged leaf as its flat
    values and row partitions (see `resumeloader.core.wire`), other leaves as batches."""

    def one(leaf: spec_lib.LeafSpec) -> Any:
        if not leaf.ragged:
            return leaf_spec(leaf, batch_dim)
        rank = _ragged_rank(leaf)
        dtype = tf.string if leaf.is_string else tf.as_dtype(leaf.dtype)
        values = tf.TensorSpec((None, *leaf.shape[rank:]), dtype)
        parts = tuple(
            tf.TensorSpec((None,) if dim is None else (), tf.int64) for dim in leaf.shape[:rank]
        )
        return values, parts

    return optree.tree_unflatten(spec.treespec, [one(leaf) for leaf in spec.leaves])


def decode(spec: spec_lib.RecordSpec, batch: Any) -> Any:
    """A produced batch (NumPy, variable leaves in the wire format) as `wire_spec` describes
    it, in NumPy: strings as object arrays of bytes, ragged leaves as their parts."""
    leaves = spec.treespec.flatten_up_to(batch)
    decoded = [
        wire.decode(value, leaf) if leaf.variable else value
        for value, leaf in zip(leaves, spec.leaves, strict=True)
    ]
    return optree.tree_unflatten(spec.treespec, decoded)


def assemble(spec: spec_lib.RecordSpec, batch: Any, batch_dim: int | None) -> Any:
    """The batch of tensors `element_spec` describes, from tensors as `wire_spec` describes
    them (eagerly or in a graph): ragged leaves built from their parts."""
    leaves = spec.treespec.flatten_up_to(batch)
    built = [
        _ragged(value, leaf, batch_dim) if leaf.ragged else value
        for value, leaf in zip(leaves, spec.leaves, strict=True)
    ]
    return optree.tree_unflatten(spec.treespec, built)


def _ragged(parts: Any, leaf: spec_lib.LeafSpec, batch_dim: int | None) -> tf.RaggedTensor:
    values, partitions = parts
    rank = _ragged_rank(leaf)
    for depth in range(rank - 1, -1, -1):  # innermost partition first
        dim, partition = leaf.shape[depth], partitions[depth]
        if dim is None:
            if depth == 0 and batch_dim is not None:  # keeps the static batch size
                partition = tf.ensure_shape(partition, (batch_dim,))
            values = tf.RaggedTensor.from_row_lengths(values, partition, validate=False)
        else:
            nrows = batch_dim if depth == 0 and batch_dim is not None else partition
            values = tf.RaggedTensor.from_uniform_row_length(
                values, dim, nrows=nrows, validate=False
            )
    return values


def spec_text(spec: Any) -> str:
    """A structure of `tf.TypeSpec` in words, e.g. ``{x: float32[None,3]}``."""

    def leaf(s: Any) -> str:
        dims = ",".join("None" if d is None else str(d) for d in s.shape.as_list())
        kind = "ragged " if isinstance(s, tf.RaggedTensorSpec) else ""
        return f"{kind}{s.dtype.name}[{dims}]"

    text = str(optree.tree_map(leaf, spec, none_is_leaf=True))
    return text.replace("'", "")
