"""`BufferPool`: recycled batch memory, arrays that come back when nothing can read them.

Once TensorFlow builds a ``from_generator`` dataset it sets glibc's
``M_MMAP_THRESHOLD`` to 128 KiB for the whole process (and so switches glibc's
dynamic threshold off): from then on every allocation of 128 KiB or more is a fresh
``mmap`` whose pages fault in on first touch. A CIFAR batch of 128 images is 384 KiB:
allocated per batch, it costs about 100 page faults, more than the copy itself. So
the library takes its large batch buffers from here instead, and steady-state batch
production maps no fresh memory in any malloc regime.

A buffer goes back to the pool only when the array handed out, every view of it,
and whatever took its memory (an eager tensor through DLPack holds the array until
TensorFlow frees the tensor) are gone: the arrays' memory is owned by a small
lease (a ``memoryview`` of the pooled memory, the array's ``base``, which every view
of the array references in turn), and a weak reference to the lease returns the
memory when the lease dies.
Nothing that can still read a buffer ever sees it reused.

Arrays under `MIN_BYTES` are neither pooled nor aligned: they come from ``np.empty``
(glibc serves them from its heap without mapping anything), and `core/handoff.py` does
not hand them over. The pool keeps at most `MAX_FREE` free buffers per size class and
`MAX_FREE_BYTES` in all; `clear` drops them. Pure NumPy, thread-safe without
locks (the free lists are deques; a weak reference's callback may run in any thread,
inside the garbage collector).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import Any

import numpy as np

__all__ = [
    "ALIGNMENT", "MAX_FREE", "MAX_FREE_BYTES", "MIN_BYTES", "POOL", "BufferPool", "address",
    "empty",
]

#: The alignment of every pooled array: TensorFlow's CPU tensors need 64 bytes
#: (Eigen's largest); a tensor over memory aligned less aborts the process.
ALIGNMENT = 64
#: Smaller arrays come from NumPy as usual.
MIN_BYTES = 64 << 10
#: Free buffers kept per size class, and in all (bytes).
MAX_FREE = 8
MAX_FREE_BYTES = 512 << 20


def address(array: np.ndarray) -> int:
    """The address of `array`'s first element (cheaper than ``array.ctypes.data``)."""
    return array.__array_interface__["data"][0]


def _size_class(nbytes: int) -> int:
    """`nbytes` rounded up to one of 8 classes per power of two (at most 12.5% more)."""
    step = max(4096, 1 << max(0, nbytes.bit_length() - 4))
    return -(-nbytes // step) * step


class _Slab:
    """One pooled allocation: its raw memory and an aligned view of all of it."""

    __slots__ = ("memory", "raw", "size")

    def __init__(self, size: int) -> None:
        self.raw = np.empty(size + ALIGNMENT, np.uint8)
        start = -address(self.raw) % ALIGNMENT
        self.memory = self.raw.data[start : start + size]
        self.size = size


class BufferPool:
    """Aligned arrays whose memory is recycled (see the module docstring)."""

    def __init__(self) -> None:
        self._free: dict[int, deque[_Slab]] = {}
        # id of the weak reference to a live lease -> (the reference, its slab)
        self._leased: dict[int, tuple[weakref.ref[Any], _Slab]] = {}
        self._free_bytes = 0  # approximate under concurrent returns: a bound, not a count
        self.allocated = 0  # slabs ever allocated (fresh memory), for tests and benchmarks
        self.reused = 0  # slabs handed out again

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array of `shape` and `dtype`: of `MIN_BYTES` or
        more, 64-byte aligned and its memory back in the pool once nothing references
        it; smaller, ``np.empty``'s."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_BYTES or dtype.hasobject:
            return np.empty(shape, dtype)
        size = _size_class(nbytes)
        slab = None
        free = self._free.get(size)
        if free:
            try:
                slab = free.pop()
                self.reused += 1
                self._free_bytes -= size
            except IndexError:  # emptied by another thread meanwhile
                slab = None
        if slab is None:
            slab = _Slab(size)
            self.allocated += 1
        # The lease: the memoryview NumPy makes `flat`'s base, which every array over
        # this memory references (`flat` is the base of the array and of its views);
        # the slab comes back when it dies.
        flat = np.frombuffer(slab.memory[:nbytes], dtype)
        ref = weakref.ref(flat.base, self._returned)  # a memoryview only `flat` holds
        self._leased[id(ref)] = (ref, slab)
        return flat.reshape(shape)

    def _returned(self, ref: weakref.ref[Any], new: type[deque[_Slab]] = deque) -> None:
        # `new` is bound here and these failures ignored: at interpreter exit the
        # module's globals may be None already (and the memory going, as it should).
        try:
            entry = self._leased.pop(id(ref), None)
            if entry is None:
                return
            slab = entry[1]
            free = self._free.setdefault(slab.size, new())
            if len(free) < MAX_FREE and self._free_bytes + slab.size <= MAX_FREE_BYTES:
                free.append(slab)
                self._free_bytes += slab.size
        except (TypeError, AttributeError):
            pass

    def free_bytes(self) -> int:
        """Bytes held in free buffers."""
        return sum(size * len(free) for size, free in list(self._free.items()))

    @property
    def leased(self) -> int:
        """Buffers handed out and still referenced."""
        return len(self._leased)

    def clear(self) -> None:
        """Drops the free buffers (their memory goes back to malloc)."""
        self._free.clear()
        self._free_bytes = 0


#: The process's pool (worker processes have their own).
POOL = BufferPool()


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """`BufferPool.empty` of the process's pool."""
    return POOL.empty(shape, dtype)
