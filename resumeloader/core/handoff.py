"""Arrays the library made itself and nobody else holds: their memory may be handed over.

A batch gathered from in-memory numeric columns (`gather`), or copied out of a worker's
shared memory (`copy`), is a fresh array in recycled memory (`core/buffers.py`),
aligned as TensorFlow's kernels require (64 bytes), that no user code has seen. `for batch in
loader` may then give its memory to the eager tensor (DLPack) instead of copying it:
nothing can write to it afterwards. Any other array (a view of a worker's shared
memory, an array a source returned and may keep or reuse) is copied. `gather` marks
the first kind where it is made; `take` asks, once, where it becomes a tensor.

A small numeric array (under `buffers.MIN_BYTES`: labels, a batch of scalars) is
copied, as any other array, but into fresh aligned memory of its own (`small`) that is
then handed over: TensorFlow's own conversion (``tf.constant``) costs three times the
copy and the hand-over together (about 45 us against 16 us for an int64[128] batch
just after a batch's worth of memory went through the cache).
"""

from __future__ import annotations

import weakref

import numpy as np

from resumeloader.core import buffers

__all__ = ["ALIGNMENT", "check_indices", "copy", "fresh", "gather", "mark", "small", "take"]

#: The alignment of TensorFlow's CPU tensors (Eigen's largest): a tensor over memory
#: aligned less fails a check in its kernels (and aborts the process).
ALIGNMENT = buffers.ALIGNMENT

# id -> array, for marked arrays still alive (an entry goes with its array).
_FRESH: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def mark(array: np.ndarray) -> np.ndarray:
    """Records `array`, just made here, referenced by no user code and 64-byte aligned
    (`buffers.BufferPool.empty` of `buffers.MIN_BYTES` or more), as fresh; a smaller
    array is left unmarked (a copy of it costs less than the hand-over)."""
    if array.nbytes >= buffers.MIN_BYTES:
        _FRESH[id(array)] = array
    return array


def check_indices(indices: np.ndarray, rows: int) -> np.ndarray:
    """`indices` as `gather` takes them unchecked: in ``[0, rows)`` (negative ones counted
    from the end).

    Raises:
        IndexError: an index is outside ``[-rows, rows)``.
    """
    if not len(indices):
        return indices
    low, high = int(indices.min()), int(indices.max())
    if low < -rows or high >= rows:
        bad = indices[(indices < -rows) | (indices >= rows)][:3].tolist()
        msg = (f"Record indices out of range for a column of {rows} records. "
               f"Received: {bad}; expected indices in [{-rows}, {rows}).")
        raise IndexError(msg)
    return indices % rows if low < 0 else indices


def gather(column: np.ndarray, indices: np.ndarray, *, checked: bool = False) -> np.ndarray:
    """``column[indices]`` in recycled memory aligned to `ALIGNMENT` (`core/buffers.py`),
    marked fresh; a non-numeric column (strings, objects), or an array subclass with
    indexing of its own, is indexed as usual, not marked.

    The rows are written straight into the batch: ``np.take(..., mode="clip")`` does
    not buffer its output as the default ``mode="raise"`` does (a second temporary of
    the batch's size), so the indices are checked here first (`check_indices`), unless
    the caller did already (`checked`).

    Raises:
        IndexError: an index is outside ``[-len(column), len(column))``.
    """
    if column.dtype.kind not in "iuf" or type(column) not in (np.ndarray, np.memmap):
        return column[indices]
    if not checked:
        indices = check_indices(indices, len(column))
    out = buffers.empty((len(indices), *column.shape[1:]), column.dtype)
    np.take(column, indices, axis=0, out=out, mode="clip")
    return mark(out)


def copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of numeric `array` in recycled aligned memory, marked fresh
    (a batch read out of a worker's shared memory, whose block is reused)."""
    out = buffers.empty(array.shape, array.dtype.newbyteorder("="))
    np.copyto(out, array)
    return mark(out)


def small(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of numeric `array`, in native byte order, in fresh memory
    aligned to `ALIGNMENT` that nothing else references (not pooled: each copy has its
    own, freed with the last array or tensor over it)."""
    dtype = array.dtype.newbyteorder("=")
    raw = np.empty(array.nbytes + ALIGNMENT, np.uint8)
    start = -buffers.address(raw) % ALIGNMENT
    out = raw[start : start + array.nbytes].view(dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def fresh(array: np.ndarray) -> bool:
    """Whether `array` is marked fresh (it stays marked: see `take`)."""
    return _FRESH.get(id(array)) is array


def take(array: np.ndarray) -> bool:
    """Whether `array` was marked fresh (and unmarks it: its memory is handed over once)."""
    if _FRESH.get(id(array)) is not array:  # marked arrays are aligned
        return False
    _FRESH.pop(id(array), None)
    return True
