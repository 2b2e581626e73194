"""`RecordSpec`, `LeafSpec`: a record's structure, each leaf's kind, dtype and shape (NumPy only).

A leaf is numeric (a NumPy dtype) or a string (`STRING`: bytes; a ``str`` is stored
as its UTF-8 bytes, as ``tf.string`` does). Its shape has fixed dimensions and
``None`` where records differ. A leaf is *variable* when it is a string or has a
``None`` dimension: its batches become ``tf.string`` tensors or ``tf.RaggedTensor`` s
and travel from the producer to TensorFlow in the batch wire format
(`resumeloader.core.wire`). A *dense* leaf (a batch stage's output, e.g. padded
tokens) has ``None`` dimensions that vary from batch to batch but not within one: its
batches are plain arrays.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import optree

__all__ = ["STRING", "LeafSpec", "RecordSpec", "describe_value", "flatten", "leaf_array"]

#: The dtype of a string leaf: NumPy object arrays holding bytes.
STRING = np.dtype(object)
_NUMERIC = "biufc"  # bool, signed, unsigned, float, complex


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Shape (without the batch dimension; None where it varies) and dtype of a leaf.

    `dense`: the None dimensions vary from batch to batch only (padded batches), so
    a batch is one array (a ``tf.Tensor`` with unknown dimensions), not ragged.
    """

    shape: tuple[int | None, ...]
    dtype: np.dtype
    dense: bool = False

    @property
    def is_string(self) -> bool:
        """Whether the leaf holds strings (bytes)."""
        return self.dtype == STRING

    @property
    def ragged(self) -> bool:
        """Whether some dimension varies from record to record."""
        return None in self.shape and not self.dense

    @property
    def variable(self) -> bool:
        """Whether batches of it are not one fixed-shape numeric array (see module doc)."""
        return self.is_string or self.ragged

    def accepts(self, array: np.ndarray) -> bool:
        """Whether `array` (one record's leaf, as `leaf_array` returns it) fits this spec."""
        if array.dtype != self.dtype or array.ndim != len(self.shape):
            return False
        pairs = zip(self.shape, array.shape, strict=True)
        return all(want is None or want == got for want, got in pairs)

    def describe(self) -> str:
        """In words, e.g. ``uint8[32, 32, 3]``, ``int64[None]``, ``string[]``."""
        name = "string" if self.is_string else self.dtype.name
        return f"{name}{list(self.shape)}"

    @staticmethod
    def covering(leaves: Sequence[np.ndarray]) -> LeafSpec | None:
        """The spec of leaves of one dtype and rank, None where their sizes differ; None
        when their dtypes or ranks differ."""
        first = leaves[0]
        if any(leaf.dtype != first.dtype or leaf.ndim != first.ndim for leaf in leaves):
            return None
        shapes = np.array([leaf.shape for leaf in leaves], dtype=np.int64).reshape(
            len(leaves), first.ndim
        )
        same = (shapes == shapes[:1]).all(axis=0)
        dims = tuple(int(d) if s else None for d, s in zip(first.shape, same, strict=True))
        return LeafSpec(dims, first.dtype)


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

    @classmethod
    def from_signature(cls, output_signature: Any) -> RecordSpec:
        """The per-record spec described by a structure of `tf.TensorSpec` (``None`` for
        a dimension that varies, ``tf.string`` for bytes or str) or `tf.RaggedTensorSpec`,
        read without importing TensorFlow.

        Raises:
            TypeError: `output_signature` is not such a structure.
            ValueError: a leaf has no rank.
        """
        leaves, treespec = optree.tree_flatten(
            output_signature, is_leaf=_is_tensor_spec, none_is_leaf=True
        )
        if not leaves or not all(_is_tensor_spec(leaf) for leaf in leaves):
            msg = (
                "`output_signature` must be a structure of tf.TensorSpec (or "
                "tf.RaggedTensorSpec) describing one record, without the batch dimension. "
                f"Received: output_signature={output_signature!r}."
            )
            raise TypeError(msg)
        specs = []
        for leaf in leaves:
            if leaf.shape.rank is None:
                msg = (
                    "`output_signature` needs the rank of every leaf (use None for a dimension "
                    f"that varies, e.g. tf.TensorSpec((None,), tf.int64)). Received: {leaf!r}."
                )
                raise ValueError(msg)
            dtype = STRING if leaf.dtype.name == "string" else np.dtype(leaf.dtype.as_numpy_dtype)
            specs.append(LeafSpec(tuple(leaf.shape.as_list()), dtype))
        return cls(treespec, tuple(specs))

    @property
    def variable(self) -> bool:
        """Whether any leaf is variable (a string or of varying shape)."""
        return any(leaf.variable for leaf in self.leaves)

    @functools.cached_property
    def one_array(self) -> tuple[np.dtype, tuple[int, ...]] | None:
        """(dtype, shape) when a record is one numeric array of a fixed shape, else None:
        such a record fits the spec exactly when it is an `np.ndarray` of that dtype and
        shape, one comparison instead of a flatten and a check per leaf."""
        if len(self.leaves) != 1 or self.treespec != _ONE_LEAF:
            return None
        leaf = self.leaves[0]
        shape = tuple(dim for dim in leaf.shape if dim is not None)
        if leaf.is_string or len(shape) != len(leaf.shape):
            return None
        return leaf.dtype, shape

    @functools.cached_property
    def fixed_leaves(self) -> tuple[tuple[np.dtype, tuple[int, ...]] | None, ...]:
        """Per leaf, (dtype, shape) when it is a numeric array of a fixed shape, else
        None: a batch's column of such a leaf fits exactly when it is an `np.ndarray` of
        that dtype and of shape ``(rows, *shape)``."""
        return tuple(
            None if leaf.is_string or None in leaf.shape
            else (leaf.dtype, tuple(int(dim) for dim in leaf.shape))  # type: ignore[arg-type]
            for leaf in self.leaves
        )

    def paths(self) -> list[str]:
        """Each leaf's path in a record, e.g. ``record['image']``, ``record[0]``, ``record``."""
        return [
            "record" + "".join(f"[{key!r}]" for key in path) for path in self.treespec.paths()
        ]

    def describe(self) -> str:
        """The spec in words, e.g. ``{image: uint8[32, 32, 3], label: int64[]}``."""
        parts = [leaf.describe() for leaf in self.leaves]
        return str(optree.tree_unflatten(self.treespec, parts)).replace("'", "")


def leaf_array(value: Any) -> np.ndarray:
    """One leaf as an array: numeric as is, strings as an object array of bytes.

    Raises:
        TypeError: `value` is not an array, number, string or bytes, or an array of
            objects that are not all strings or bytes.
    """
    if isinstance(value, (bytes, str)):
        # Not through np.asarray: NumPy's fixed-width bytes drop trailing NUL bytes.
        scalar = np.empty((), dtype=STRING)
        scalar[()] = value.encode() if isinstance(value, str) else bytes(value)
        return scalar
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    kind = array.dtype.kind
    if kind in _NUMERIC:
        return array
    if kind in "SUO":
        items = array.ravel().tolist()
        if all(isinstance(item, bytes) for item in items):
            if kind == "O":
                return array
        elif all(isinstance(item, (bytes, str)) for item in items):
            items = [item.encode() if isinstance(item, str) else item for item in items]
        else:
            bad = next(item for item in items if not isinstance(item, (bytes, str)))
            msg = (
                "Record leaves must be arrays, numbers, strings or bytes. Received an object "
                f"array holding a {type(bad).__name__}: {bad!r:.80}. A list of arrays of "
                "different lengths is a structure of leaves, not one leaf."
            )
            raise TypeError(msg)
        strings = np.empty(len(items), dtype=STRING)
        strings[:] = items
        return strings.reshape(array.shape)
    msg = (
        "Record leaves must be arrays, numbers, strings or bytes. "
        f"Received a leaf of type {type(value).__name__}: {value!r:.80}."
    )
    raise TypeError(msg)


def describe_value(value: Any) -> str:
    """A received leaf in the words of `LeafSpec.describe` (its type name when it is none)."""
    try:
        array = leaf_array(value)
    except TypeError:
        return type(value).__name__
    return LeafSpec(array.shape, array.dtype).describe()


def flatten(record: Any) -> tuple[list[np.ndarray], Any]:
    """A record's leaves as arrays (see `leaf_array`) and its structure.

    Raises:
        TypeError: a leaf is not an array, number, string or bytes.
    """
    leaves, treespec = optree.tree_flatten(record, none_is_leaf=True)
    return [leaf_array(leaf) for leaf in leaves], treespec


# The structure of a record that is a single leaf (an array, a number, a string).
_ONE_LEAF = flatten(np.zeros(()))[1]


def _is_tensor_spec(value: Any) -> bool:
    """Whether `value` is a `tf.TensorSpec` or `tf.RaggedTensorSpec` (told by its classes'
    names: this layer does not import TensorFlow)."""
    return any(
        kind.__name__ in ("TensorSpec", "RaggedTensorSpec")
        and kind.__module__.startswith("tensorflow.")
        for kind in type(value).__mro__
    )
