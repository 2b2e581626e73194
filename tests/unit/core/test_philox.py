"""Array Philox4x64-10 and NumPy's Philox state: bit for bit NumPy's own stream."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.core import philox

_U64 = st.integers(0, 2**64 - 1)


def _numpy_words(low: int, high: int, first_block: int, count: int) -> np.ndarray:
    generator = philox.generator(low, high)
    generator.bit_generator.advance(first_block)
    return generator.bit_generator.random_raw(count * philox.WORDS)


@settings(max_examples=200, deadline=None)
@given(lows=st.lists(_U64, min_size=1, max_size=6), high=_U64,
       first=st.integers(0, 2**40), count=st.integers(1, 5))
def test_blocks_any_keys_equal_numpy_philox_words(lows, high, first, count):
    """Every key's row is NumPy's Philox stream of that key, from the block asked for."""
    got = philox.blocks(np.array(lows, np.uint64), high, first, count)
    want = np.stack([_numpy_words(low, high, first, count) for low in lows])
    np.testing.assert_array_equal(got, want)


def test_blocks_no_keys_is_empty():
    """No rows: an empty [0, 4 * count] array, no error."""
    assert philox.blocks(np.zeros(0, np.uint64), 3, 0, 2).shape == (0, 8)


@settings(max_examples=300, deadline=None)
@given(a=st.lists(_U64, min_size=1, max_size=8), b=_U64)
def test_multiply_high_any_words_equals_python_integers(a, b):
    """The high words of 64x64-bit products are exact (Python integer reference)."""
    got = philox.multiply_high(np.array(a, np.uint64), b)
    assert got.tolist() == [x * b >> 64 for x in a]


@settings(max_examples=200, deadline=None)
@given(low=_U64, high=_U64, words=st.integers(0, 40), halves=st.integers(0, 3))
def test_move_then_place_any_point_continues_numpy_stream(low, high, words, halves):
    """A Philox moved to where another stands (words, buffered half-word) draws the same
    values after, and `place` reads that point back."""
    reference = philox.generator(low, high)
    reference.bit_generator.random_raw(words)
    # 32-bit draws: a word's low half, its high half kept for the next 32-bit draw.
    reference.integers(0, 2**32, halves, dtype=np.uint32)
    where = philox.place(reference.bit_generator)
    moved = np.random.Philox(0)
    philox.move(moved, low, high, *where)
    assert philox.place(moved) == where
    generator = np.random.Generator(moved)
    assert generator.integers(0, 2**32, 3, dtype=np.uint32).tolist() == (
        reference.integers(0, 2**32, 3, dtype=np.uint32).tolist())
    assert generator.random(5).tolist() == reference.random(5).tolist()


def test_place_fresh_generator_is_the_start():
    """A generator nothing was drawn from stands at word 0 with no half-word."""
    assert philox.place(philox.generator(1, 2).bit_generator) == (0, False, 0)
