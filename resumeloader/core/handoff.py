"""Arrays the library made itself and nobody else holds: their memory may be handed over.

A batch gathered from in-memory numeric columns (`gather`) is a fresh array, aligned as
TensorFlow's kernels require (64 bytes), that no user code has seen. `for batch in
loader` may then give its memory to the eager tensor (DLPack) instead of copying it:
nothing can write to it afterwards. Any other array (a view of a worker's shared
memory, an array a source returned and may keep or reuse) is copied. `gather` marks
the first kind where it is made; `take` asks, once, where it becomes a tensor.
"""

from __future__ import annotations

import weakref

import numpy as np

__all__ = ["ALIGNMENT", "gather", "mark", "take"]

#: The alignment of TensorFlow's CPU tensors (Eigen's largest): a tensor over memory
#: aligned less fails a check in its kernels (and aborts the process).
ALIGNMENT = 64

# id -> array, for marked arrays still alive (an entry goes with its array).
_FRESH: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def mark(array: np.ndarray) -> np.ndarray:
    """Records `array`, just made here and referenced by no user code, as fresh."""
    _FRESH[id(array)] = array
    return array


def gather(column: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``column[indices]`` in fresh memory aligned to `ALIGNMENT`, marked fresh; a
    non-numeric column (strings, objects), or an array subclass with indexing of its
    own, is indexed as usual, not marked."""
    if column.dtype.kind not in "iuf" or type(column) not in (np.ndarray, np.memmap):
        return column[indices]
    shape = (len(indices), *column.shape[1:])
    nbytes = int(np.prod(shape, dtype=np.int64)) * column.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    out = raw[start : start + nbytes].view(column.dtype).reshape(shape)
    np.take(column, indices, axis=0, out=out)
    return mark(out)


def take(array: np.ndarray) -> bool:
    """Whether `array` was marked fresh and is aligned (and unmarks it: its memory is
    handed over once)."""
    if _FRESH.get(id(array)) is not array or array.ctypes.data % ALIGNMENT:
        return False
    _FRESH.pop(id(array), None)
    return True
