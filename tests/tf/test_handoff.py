"""Eager batches that take over a gathered array's memory, and those that must not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from resumeloader import ResumableLoader
from resumeloader.core import handoff


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float32])
def test_gather_equals_fancy_index_aligned_and_marked(dtype):
    """A gathered batch of MIN_BYTES or more is column[indices], aligned, handed over once."""
    column = np.arange(7 * 64 * 1024).reshape(7, 64, 1024).astype(dtype)
    indices = np.array([6, 0, 3, 3, -1])

    out = handoff.gather(column, indices)

    np.testing.assert_array_equal(out, column[indices])
    assert out.ctypes.data % handoff.ALIGNMENT == 0
    assert handoff.take(out)
    assert not handoff.take(out)  # handed over once


def test_gather_of_a_small_batch_is_correct_and_unmarked():
    """A batch under MIN_BYTES is not handed over (a copy of it costs less)."""
    column = np.arange(7 * 3 * 5).reshape(7, 3, 5).astype(np.int64)
    indices = np.array([6, 0, -2])
    out = handoff.gather(column, indices)
    np.testing.assert_array_equal(out, column[indices])
    assert not handoff.take(out)


@pytest.mark.parametrize("bad", [[0, 7], [-8, 1]], ids=["past-the-end", "before-the-start"])
def test_check_indices_out_of_range_names_them(bad):
    """An index outside [-rows, rows) raises IndexError naming it and the bounds."""
    with pytest.raises(IndexError, match=r"Received: \[-?\d+\]; expected indices in \[-7, 7\)"):
        handoff.check_indices(np.array(bad), 7)


def test_check_indices_counts_negative_ones_from_the_end():
    """Negative indices become rows - k; non-negative ones are returned as they are."""
    np.testing.assert_array_equal(handoff.check_indices(np.array([-1, 0, -7]), 7), [6, 0, 0])
    indices = np.array([1, 2])
    assert handoff.check_indices(indices, 7) is indices


def test_gather_strings_and_subclasses_index_as_usual_unmarked():
    strings = np.array([b"a", b"bb", b"ccc"], dtype=object)
    out = handoff.gather(strings, np.array([2, 0]))
    assert out.tolist() == [b"ccc", b"a"]
    assert not handoff.take(out)
    matrix = np.ma.masked_array(np.arange(4))
    assert not handoff.take(handoff.gather(matrix, np.array([1])))


def test_take_refuses_an_array_never_marked():
    assert not handoff.take(np.arange(10))


def test_eager_batches_keep_their_values_after_later_batches():
    """Tensors that took over gathered memory are not overwritten by later batches."""
    images = np.arange(64 * 8 * 8, dtype=np.float32).reshape(64, 8, 8)
    labels = np.arange(64)
    loader = ResumableLoader((images, labels), batch_size=8, seed=5, num_epochs=2)
    kept = list(loader)  # every tensor alive at once, 16 batches
    for image, label in kept:
        np.testing.assert_array_equal(image.numpy(), images[label.numpy()])


def _aligned_zeros(rows: int) -> np.ndarray:
    """A fresh float32[rows, 3] buffer aligned as a handed-over batch would be, so only
    the library's record of what it made itself keeps it from being shared."""
    raw = np.zeros(rows * 3 * 4 + handoff.ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % handoff.ALIGNMENT
    return raw[start : start + rows * 12].view(np.float32).reshape(rows, 3)


class _ReusingSource:
    """A source whose read_batch fills and returns one (aligned) buffer it keeps and
    reuses."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.buffer = _aligned_zeros(4)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(3, index, np.float32)

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        if len(indices) != len(self.buffer):
            self.buffer = _aligned_zeros(len(indices))
        self.buffer[...] = np.asarray(indices, np.float32)[:, None]
        return self.buffer


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_source_buffer_reused_between_batches_is_copied(prefetch):
    """An array a source returns (and may overwrite) is never shared with a tensor."""
    loader = ResumableLoader(_ReusingSource(16), batch_size=4, seed=1, num_epochs=1,
                             prefetch=prefetch)
    batches = list(itertools.islice(loader, 4))  # all alive; the buffer rewritten since

    rows = [row for batch in batches for row in batch.numpy()]
    assert sorted(int(row[0]) for row in rows) == list(range(16))
    assert all((row == row[0]).all() for row in rows)


@pytest.mark.parametrize("dtype", [">i8", "<f4", "u2", "f2"])
def test_small_is_an_aligned_native_copy_sharing_nothing(dtype):
    """`small` copies a small array into fresh aligned memory, in native byte order."""
    array = np.arange(12).reshape(3, 4).astype(dtype)[:, ::2]  # strided, maybe swapped

    out = handoff.small(array)

    np.testing.assert_array_equal(out, array)
    assert out.ctypes.data % handoff.ALIGNMENT == 0 and out.flags.c_contiguous
    assert out.dtype.isnative and not np.shares_memory(out, array)
    assert not np.shares_memory(out, handoff.small(array))  # each copy its own


class _KeptOutput:
    """A ``map_batch`` function that returns a small buffer it keeps and rewrites on
    every call, with the labels."""

    def __init__(self) -> None:
        self.buffer = _aligned_zeros(8)

    def __call__(self, batch, rngs):
        _images, labels = batch
        self.buffer[...] = labels[:, None] + rngs.random()[:, None]
        return self.buffer, labels


@pytest.mark.parametrize("prefetch", [0, 2])
def test_map_batch_small_outputs_kept_by_the_user_keep_their_values(prefetch):
    """Small outputs (a buffer the function rewrites, the labels) are handed over as
    copies: every batch the user keeps holds its own values after later batches."""
    import tensorflow as tf

    import resumeloader

    images = np.zeros((64, 2), np.float32)
    labels = np.arange(64)
    signature = (tf.TensorSpec((3,), tf.float32), tf.TensorSpec((), tf.int64))
    pipeline = (resumeloader.Pipeline((images, labels), seed=3).shuffle().batch(8)
                .map_batch(_KeptOutput(), output_signature=signature))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=2, prefetch=prefetch)
    kept = list(loader)  # every tensor alive at once, 16 batches

    assert len(kept) == 16
    seen = []
    for values, label in kept:
        label = label.numpy()
        seen.extend(label.tolist())
        np.testing.assert_array_equal(np.floor(values.numpy()), label[:, None] + np.zeros(3))
    assert sorted(seen) == sorted(list(range(64)) * 2)
