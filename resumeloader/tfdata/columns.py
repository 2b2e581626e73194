"""In-memory columns as tensors without a copy (the gather path's source).

A NumPy array becomes a tensor that reads it in place (through DLPack) when
TensorFlow can address it (C-contiguous, writeable or a read-only view of a
writeable array, native byte order, 64-byte aligned); otherwise the array is copied
once into aligned memory, and that copy is shared by every loader and iterator over
the same array (while any of them lives; a copy is matched by the array's memory,
layout and sampled content digest).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader.core import buffers
from resumeloader.sources import digest

__all__ = ["tensor"]

# TensorFlow's kernels assume buffers aligned to EIGEN_MAX_ALIGN_BYTES (at most 64) and
# abort the process on a misaligned one, so only such arrays are read in place.
_ALIGNMENT = 64


def tensor(leaf: np.ndarray) -> tf.Tensor:
    """`leaf` as a tensor that shares its memory, or shares that of its aligned copy."""
    leaf = _unlocked(leaf)
    if not (
        leaf.flags.c_contiguous
        and leaf.flags.writeable  # NumPy exports no read-only array through DLPack
        and leaf.dtype.isnative
        and buffers.address(leaf) % _ALIGNMENT == 0
    ):
        leaf = _shared_copy(leaf)
    # The tensor keeps `leaf` (and the memory it views) alive until it is freed.
    return tf.experimental.dlpack.from_dlpack(leaf.__dlpack__())


# (address, shape, strides, dtype, content digest) of an array -> (a weak reference to
# the array that owns that memory, a weak reference to its aligned copy). Every loader
# and iterator over one array shares one copy, alive while any of their tensors is.
_COPIES: dict[tuple[Any, ...], tuple[weakref.ref[Any], weakref.ref[np.ndarray]]] = {}
_COPIES_LOCK = threading.Lock()


def _owner(leaf: np.ndarray) -> Any:
    """The object that owns the memory `leaf` views (its last base), or `leaf`."""
    owner: Any = leaf
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner


def _shared_copy(leaf: np.ndarray) -> np.ndarray:
    """The aligned copy of `leaf` (`_aligned_copy`), made once for every loader over the
    same array: keyed by its memory, layout and sampled content (`sources.digest`),
    valid while the array that owns the memory lives."""
    owner = _owner(leaf)
    try:
        owner_ref = weakref.ref(owner)
    except TypeError:  # an owner without weak references: no sharing, one copy each
        return _aligned_copy(leaf)
    key = (leaf.ctypes.data, leaf.shape, leaf.strides, leaf.dtype.str,
           digest.columns_digest([leaf]))
    with _COPIES_LOCK:
        for stale in [k for k, (o, c) in _COPIES.items() if o() is None or c() is None]:
            del _COPIES[stale]
        entry = _COPIES.get(key)
        if entry is not None and entry[0]() is owner:
            copy = entry[1]()
            if copy is not None:
                return copy
        copy = _aligned_copy(leaf)
        _COPIES[key] = (owner_ref, weakref.ref(copy))
        return copy


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


def _aligned_copy(leaf: np.ndarray) -> np.ndarray:
    """A C-contiguous, native-order copy of `leaf` starting on an _ALIGNMENT boundary."""
    dtype = leaf.dtype.newbyteorder("=")
    size = leaf.size * dtype.itemsize
    raw = np.empty(size + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    copy = raw[start : start + size].view(dtype).reshape(leaf.shape)
    np.copyto(copy, leaf)
    return copy
