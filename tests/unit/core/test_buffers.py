"""The recycled batch memory (`core/buffers.py`) and the gathers written into it."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from resumeloader.core import buffers, handoff, wire
from resumeloader.core import spec as spec_lib

_SHAPE = (128, 32, 32, 3)  # a CIFAR batch: 384 KiB


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_pool_hands_out_aligned_writeable_contiguous_arrays():
    """A pooled array is 64-byte aligned, writeable and C-contiguous, of the asked shape."""
    array = buffers.BufferPool().empty(_SHAPE, np.uint8)
    assert array.shape == _SHAPE and array.dtype == np.uint8
    assert _address(array) % buffers.ALIGNMENT == 0
    assert array.flags.writeable and array.flags.c_contiguous


def test_pool_reuses_a_buffer_once_its_array_is_released():
    """The memory of a dropped array is handed out again, without allocating."""
    pool = buffers.BufferPool()
    first = pool.empty(_SHAPE, np.uint8)
    address = _address(first)
    del first
    again = pool.empty(_SHAPE, np.uint8)
    assert _address(again) == address
    assert (pool.allocated, pool.reused) == (1, 1)


@pytest.mark.parametrize(
    "hold",
    [
        lambda a: a[3:5],
        lambda a: a.reshape(-1)[10:],
        lambda a: memoryview(a),
        lambda a: a.__dlpack__(),
    ],
    ids=["slice", "view-of-reshape", "memoryview", "dlpack-capsule"],
)
def test_pool_never_reuses_a_buffer_something_can_still_read(hold):
    """While a view, a memoryview or a DLPack capsule of a batch lives, its memory is
    not handed out again; once it is gone, it is."""
    pool = buffers.BufferPool()
    first = pool.empty(_SHAPE, np.uint8)
    first[...] = 7
    address = _address(first)
    held = hold(first)
    del first
    gc.collect()
    others = [pool.empty(_SHAPE, np.uint8) for _ in range(3)]
    for other in others:
        other[...] = 0
    assert address not in {_address(o) for o in others}
    del held, others, other
    gc.collect()
    again = [pool.empty(_SHAPE, np.uint8) for _ in range(4)]
    assert address in {_address(a) for a in again}
    assert pool.allocated == 4


def test_pool_serves_the_smaller_last_batch_from_its_own_class():
    """Sizes are rounded to a class (at most 12.5% more), a class reused for its sizes."""
    pool = buffers.BufferPool()
    for rows in (128, 128, 100, 100):
        pool.empty((rows, 3072), np.uint8)
    assert pool.allocated == 2 and pool.reused == 2


def test_pool_leaves_small_arrays_to_numpy():
    """Arrays under MIN_BYTES come from np.empty as usual: not pooled, not leased."""
    pool = buffers.BufferPool()
    small = pool.empty((16, 16), np.float32)
    assert small.shape == (16, 16) and small.dtype == np.float32
    assert small.flags.c_contiguous and small.flags.writeable
    assert pool.allocated == 0 and pool.leased == 0


def test_address_is_the_first_element_address():
    """`address` agrees with ``ctypes.data``, for views with an offset too."""
    array = np.arange(100, dtype=np.int64)
    assert buffers.address(array) == array.ctypes.data
    assert buffers.address(array[3:]) == array.ctypes.data + 3 * 8


def test_pool_keeps_a_bounded_number_of_free_buffers():
    """At most MAX_FREE free buffers per size class are kept; clear drops them."""
    pool = buffers.BufferPool()
    arrays = [pool.empty(_SHAPE, np.uint8) for _ in range(buffers.MAX_FREE + 5)]
    del arrays
    gc.collect()
    size = buffers._size_class(int(np.prod(_SHAPE)))
    assert pool.free_bytes() == buffers.MAX_FREE * size
    pool.clear()
    assert pool.free_bytes() == 0


def test_gather_writes_into_recycled_memory_and_reuses_it():
    """handoff.gather equals fancy indexing and, batch after batch, maps nothing new."""
    column = np.random.default_rng(0).integers(0, 255, (1000, 32, 32, 3), dtype=np.uint8)
    indices = np.random.default_rng(1).integers(0, 1000, 128)
    before = buffers.POOL.allocated
    for _ in range(20):
        out = handoff.gather(column, indices)
        np.testing.assert_array_equal(out, column[indices])
        del out
    assert buffers.POOL.allocated - before <= 1


def test_gather_negative_indices_count_from_the_end():
    column = np.arange(10 * 4, dtype=np.int64).reshape(10, 4)
    np.testing.assert_array_equal(handoff.gather(column, np.array([-1, 0, -10])),
                                  column[[-1, 0, -10]])


def test_gather_out_of_range_index_raises_naming_it():
    """The unbuffered take never clips: an index out of range raises IndexError."""
    column = np.zeros((10, 4), np.float32)
    with pytest.raises(IndexError, match=r"Received: \[10\]; expected indices in \[-10, 10\)"):
        handoff.gather(column, np.array([3, 10]))


def test_copy_out_of_shared_memory_is_recycled_and_marked():
    """handoff.copy: an equal, aligned, fresh (handed over once) array."""
    view = np.arange(300_000, dtype=np.int64)[1:]
    out = handoff.copy(view)
    np.testing.assert_array_equal(out, view)
    assert _address(out) % buffers.ALIGNMENT == 0
    assert handoff.take(out) and not handoff.take(out)


@pytest.mark.parametrize(
    ("column", "leaf"),
    [
        ([np.arange(n, dtype=np.float32) for n in (3, 0, 70_000)],
         spec_lib.LeafSpec((None,), np.float32)),
        ([b"x" * n for n in (5, 0, 200_000)], spec_lib.LeafSpec((), spec_lib.STRING)),
        ([b"ab", "c"], spec_lib.LeafSpec((), spec_lib.STRING)),
    ],
    ids=["ragged-large", "strings-large", "strings-small"],
)
def test_wire_values_start_aligned_and_round_trip(column, leaf):
    """The wire format's values start on a 64-byte boundary of the buffer (of the memory
    too when it is pooled, MIN_BYTES or more); decode gives back the column."""
    encoded = wire.encode(column, leaf)
    count = int(encoded[:8].view(np.int64)[0])
    assert wire._payload_start(count) % buffers.ALIGNMENT == 0
    pooled = encoded.nbytes >= buffers.MIN_BYTES
    assert not pooled or _address(encoded) % buffers.ALIGNMENT == 0
    decoded = wire.decode(encoded, leaf)
    if leaf.is_string:
        assert decoded.tolist() == [v if isinstance(v, bytes) else v.encode() for v in column]
    else:
        values, (lengths,) = decoded
        assert not pooled or _address(values) % buffers.ALIGNMENT == 0
        assert lengths.tolist() == [len(v) for v in column]
        np.testing.assert_array_equal(values, np.concatenate(column))


def test_a_packed_column_hands_over_the_strings_it_carries_and_only_those():
    """`wire.with_strings`: decode gives the strings the column carries (made from its
    bytes by the source), as a fresh object array each time; a view, a copy or a
    pickle (a process worker's batch) carries none and is decoded from its bytes."""
    import pickle

    leaf = spec_lib.LeafSpec((), spec_lib.STRING)
    words = [b"alpha", b"", b"gamma" * 30_000]
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    starts = np.array([7, 0, 20], dtype=np.int64)  # anywhere, with bytes between them
    column, values = wire.packed(lengths, starts, 20 + len(words[2]))
    values[:] = 0
    for word, start in zip(words, starts.tolist(), strict=True):
        values[start : start + len(word)] = np.frombuffer(word, dtype=np.uint8)
    carried = wire.with_strings(column, list(words))
    assert carried.strings == words and np.shares_memory(carried, column)
    first, second = wire.decode(carried, leaf), wire.decode(carried, leaf)
    assert first.tolist() == second.tolist() == words and first is not second
    for plain in (carried[:], carried.copy(), np.array(carried),
                  pickle.loads(pickle.dumps(carried))):
        assert getattr(plain, "strings", None) is None
        assert wire.decode(plain, leaf).tolist() == words
