"""In-memory columns as tf.data reads their rows: in place, or gathered by NumPy, never copied.

A `Column` is read in place by ``tf.gather`` (its memory given to a tensor through
DLPack) when TensorFlow can address it: C-contiguous, writeable or a read-only view of
a writeable array, native byte order, and 64-byte aligned. TensorFlow's kernels check
that alignment and abort the process on a tensor aligned less, and the large arrays
NumPy allocates (``np.load``'s, ``np.empty``'s) start 16 bytes past a 64-byte
boundary; the rows of such a column, or of a strided, read-only or big-endian one,
are gathered by NumPy (``tf.numpy_function``) into recycled aligned memory
(`resumeloader.core.buffers`) that TensorFlow takes over. Either way nothing is
copied or scanned when the column is made, so the first batch does not wait for the
array's size.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader.core import buffers, exiting, handoff

__all__ = ["Column", "by_numpy", "read_as"]

# TensorFlow's kernels check that a tensor's buffer is aligned to EIGEN_MAX_ALIGN_BYTES
# (64) and abort the process otherwise, so only such arrays are read in place.
_ALIGNMENT = buffers.ALIGNMENT


class Column:
    """One in-memory column as tf.data gathers its rows (see the module docstring): in
    place through ``tf.gather`` when TensorFlow can address the array, else by NumPy into
    recycled aligned memory. Nothing is copied when it is made.

    Args:
        leaf: the column (first dimension: records).
    """

    def __init__(self, leaf: np.ndarray) -> None:
        leaf = _unlocked(leaf)
        #: Whether ``tf.gather`` reads the array's own memory.
        self.in_place = bool(
            leaf.flags.c_contiguous
            and leaf.flags.writeable  # NumPy exports no read-only array through DLPack
            and leaf.dtype.isnative
            and buffers.address(leaf) % _ALIGNMENT == 0
        )
        self._leaf = leaf
        self._dtype = leaf.dtype.newbyteorder("=")
        self._tensor: tf.Tensor | None = None

    def gather(self, index: tf.Tensor) -> tf.Tensor:
        """The rows at `index` (an int64 vector tensor, within the column), as TensorFlow ops."""
        if self.in_place:
            if self._tensor is None:
                with tf.init_scope():
                    # The tensor keeps `leaf` (and the memory it views) alive until freed.
                    self._tensor = tf.experimental.dlpack.from_dlpack(self._leaf.__dlpack__())
            return tf.gather(self._tensor, index)
        exiting.install()
        rows = tf.numpy_function(
            weakly(self, Column.take), [index], tf.as_dtype(self._dtype), stateful=False
        )
        rows.set_shape((index.shape[0], *self._leaf.shape[1:]))
        return rows

    def take(self, index: np.ndarray) -> np.ndarray:
        """``leaf[index]`` in native byte order, in recycled memory aligned for TensorFlow
        (`core/buffers.py`) when large enough to be worth it."""
        index = handoff.check_indices(index, len(self._leaf))
        rows = buffers.empty((len(index), *self._leaf.shape[1:]), self._dtype)
        if self._leaf.dtype.isnative:
            np.take(self._leaf, index, axis=0, out=rows, mode="clip")  # unbuffered
        else:
            rows[...] = self._leaf[index]
        return rows


def by_numpy(columns: list[Column]) -> int:
    """How many of `columns` NumPy gathers (not read in place by TensorFlow)."""
    return sum(not column.in_place for column in columns)


def read_as(columns: list[Column]) -> str:
    """How tf.data reads `columns`, as ``describe()`` says it: in place, by NumPy, or both."""
    numpy_count = by_numpy(columns)
    if not numpy_count:
        return "as constant tensors"
    why = "not 64-byte aligned, strided, read-only or big-endian"
    if numpy_count == len(columns):
        return f"gathered by NumPy ({why})"
    return (f"{len(columns) - numpy_count} of {len(columns)} columns as constant tensors, "
            f"{numpy_count} gathered by NumPy ({why})")


def weakly(target: Any, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call(target, *args)`` for ``tf.numpy_function``, holding `target` only weakly: in
    eager mode TensorFlow keeps every ``numpy_function`` callable for the life of the
    process (see `resumeloader.tfdata.generator`), and with it what the callable holds
    (a column's array, a path's loader). Each call is `exiting.busy` and refused once
    the interpreter exits."""
    ref = weakref.ref(target)

    def weak(*args: Any) -> Any:
        with exiting.busy():
            exiting.check("dataset() batches")
            held = ref()
            if held is None:
                msg = "This dataset's loader was garbage collected; keep the dataset referenced."
                raise RuntimeError(msg)
            return call(held, *args)

    return weak


def _unlocked(leaf: np.ndarray) -> np.ndarray:
    """A writeable view of the memory of `leaf`, a read-only C-contiguous view of a
    writeable array; otherwise `leaf` itself.

    `ArraySource` hands its columns out as read-only views of the user's arrays, and
    NumPy exports no read-only array through DLPack; the gather only reads them.
    """
    owner = leaf.base
    if (
        leaf.flags.writeable
        or not leaf.flags.c_contiguous
        or not isinstance(owner, np.ndarray)
        or not (owner.flags.writeable and owner.flags.c_contiguous)
    ):
        return leaf
    offset = leaf.ctypes.data - owner.ctypes.data
    if offset < 0 or offset + leaf.nbytes > owner.nbytes:
        return leaf
    return np.ndarray(leaf.shape, leaf.dtype, buffer=owner, offset=offset)
