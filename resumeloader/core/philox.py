"""NumPy's Philox4x64-10 stream for many keys at once, with array operations.

`numpy.random.Philox` is counter based: word ``w`` of the stream of key ``k`` is word
``w % 4`` of the block ``Philox(k, counter=w // 4 + 1)`` (NumPy increments its counter
before each block). So the streams of a batch's records, one key each, are computed
together: `blocks` runs the ten rounds over a ``[keys, blocks]`` array, the 64x64 to
128-bit products of a round from their 32-bit halves (`multiply_high`). `move` and
`place` translate a place in a stream to and from NumPy's own Philox state, so a
real `numpy.random.Generator` can carry on from where the arrays stopped, and back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.random import bit_generator

__all__ = ["WORDS", "Key", "blocks", "generator", "move", "multiply_high", "place"]

#: Words (uint64) per Philox block.
WORDS = 4
# Philox4x64's round multipliers and Weyl key increments (Salmon et al., SC'11).
_MULTIPLIERS = (0xD2E7470EE14C6C93, 0xCA5A826395121157)
_WEYL = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
_ROUNDS = 10
_M64 = (1 << 64) - 1
# Round r's key is the key plus r times the Weyl increments: [round, (k0, k1), 1, 1].
_ROUND_KEYS = np.array(
    [[r * w & _M64 for w in _WEYL] for r in range(_ROUNDS)], np.uint64
).reshape(_ROUNDS, 2, 1, 1)
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
# Philox copies its counter in; passing it as an array skips an int-to-words conversion.
_ZERO_COUNTER = np.zeros(4, np.uint64)


def multiply_high(a: np.ndarray, b: Any) -> np.ndarray:
    """The high 64 bits of the 128-bit products ``a * b`` (uint64 arrays, broadcast), exact."""
    a_low, a_high = a & _LOW, a >> _32
    b = np.asarray(b, np.uint64)
    b_low, b_high = b & _LOW, b >> _32
    high = np.empty(np.broadcast_shapes(a.shape, b.shape), np.uint64)
    cross = np.empty_like(high)
    _multiply_high(a_low, a_high, b_low, b_high, high, cross)
    return high


def _multiply_high(
    a_low: np.ndarray, a_high: np.ndarray, b_low: np.ndarray, b_high: np.ndarray,
    high: np.ndarray, cross: np.ndarray,
) -> None:
    """``high`` = the high words of ``a * b`` from the 32-bit halves of both (`a_low` and
    `a_high` are overwritten; `cross` is scratch): schoolbook multiplication, each
    partial sum kept below 2**64."""
    np.multiply(a_low, b_low, out=cross)
    np.right_shift(cross, _32, out=cross)
    np.multiply(a_high, b_high, out=high)
    np.multiply(a_high, b_low, out=a_high)
    np.add(cross, a_high, out=cross)  # a_high * b_low + carry < 2**64
    np.multiply(a_low, b_high, out=a_low)
    np.right_shift(cross, _32, out=a_high)
    np.add(high, a_high, out=high)
    np.bitwise_and(cross, _LOW, out=cross)
    np.add(a_low, cross, out=a_low)
    np.right_shift(a_low, _32, out=a_low)
    np.add(high, a_low, out=high)


def blocks(low_keys: np.ndarray, high_key: int, first: int, count: int) -> np.ndarray:
    """Words ``[4 * first, 4 * (first + count))`` of the stream of each key: ``[keys, 4 * count]``.

    Key ``i`` is the 128-bit Philox key ``high_key << 64 | low_keys[i]``, with NumPy's
    counter starting at 0; the result equals ``Philox(...).random_raw`` of those words.
    """
    rows = len(low_keys)
    shape = (2, rows, count)
    base = np.empty((2, rows, 1), np.uint64)
    base[0, :, 0] = low_keys
    base[1] = high_key
    keys = base[None] + _ROUND_KEYS  # every round's key: [round, (k0, k1), rows, 1]
    # The counter words as two pairs that a round treats alike: `multiplied` (c0, c2)
    # and `xored` (c1, c3), which only ever enter XORs, so each round's key is XORed
    # into them ahead. Round 0 (counter c0, 0, 0, 0) depends on the block alone.
    multiplied = np.empty(shape, np.uint64)
    xored = np.empty(shape, np.uint64)
    products = [int(c) * _MULTIPLIERS[0] for c in range(first + 1, first + count + 1)]
    multiplied[0] = keys[0, 0]
    multiplied[1] = np.array([p >> 64 for p in products], np.uint64) ^ keys[0, 1]
    xored[0] = keys[1, 0]
    xored[1] = np.array([p & _M64 for p in products], np.uint64) ^ keys[1, 1]
    factors = np.empty(shape, np.uint64)
    factors[0], factors[1] = _MULTIPLIERS
    factor_low, factor_high = factors & _LOW, factors >> _32
    a_low, a_high, high, low, cross = (np.empty(shape, np.uint64) for _ in range(5))
    for round_ in range(1, _ROUNDS):
        np.bitwise_and(multiplied, _LOW, out=a_low)
        np.right_shift(multiplied, _32, out=a_high)
        _multiply_high(a_low, a_high, factor_low, factor_high, high, cross)
        np.multiply(multiplied, factors, out=low)
        # (c0, c1, c2, c3) -> (hi(c2 m1) ^ c1 ^ k0, lo(c2 m1), hi(c0 m0) ^ c3 ^ k1, lo(c0 m0))
        np.bitwise_xor(high[::-1], xored, out=multiplied)
        if round_ + 1 < _ROUNDS:
            np.bitwise_xor(low[::-1], keys[round_ + 1], out=xored)
        else:
            xored[...] = low[::-1]
    out = np.empty((rows, count, WORDS), np.uint64)
    out[..., 0::2] = np.moveaxis(multiplied, 0, -1)
    out[..., 1::2] = np.moveaxis(xored, 0, -1)
    return out.reshape(rows, count * WORDS)


class Key(bit_generator.ISeedSequence):
    """A 128-bit Philox key (``high << 64 | low``), given to Philox as its seed sequence.

    ``Philox(key=k)`` also builds a `numpy.random.SeedSequence` from OS entropy that it
    then discards (about two thirds of its cost); given a seed sequence instead, Philox
    takes its key from ``generate_state(2, uint64)``: the same key, the same stream.
    """

    __slots__ = ("words",)

    def __init__(self, low: int, high: int) -> None:
        #: (low, high): the key's two 64-bit words.
        self.words = (low, high)

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> Any:
        """The key as `n_words` words of `dtype`, least significant first (128 bits)."""
        if n_words == 2 and dtype is np.uint64:  # what Philox asks for
            return np.array(self.words, np.uint64)
        key = self.words[0] | self.words[1] << 64
        bits = np.dtype(dtype).itemsize * 8
        if n_words * bits != 128 or bits not in (32, 64):
            msg = (
                f"A record key holds 128 bits. Received: n_words={n_words!r}, "
                f"dtype={np.dtype(dtype).name}; expected 2 uint64 or 4 uint32 words."
            )
            raise ValueError(msg)
        mask = (1 << bits) - 1
        return np.array([key >> (bits * i) & mask for i in range(n_words)], dtype=dtype)

    def __getstate__(self) -> tuple[int, int]:
        return self.words

    def __setstate__(self, words: tuple[int, int]) -> None:
        self.words = words

    def __repr__(self) -> str:
        return f"RecordKey(0x{self.words[1]:016x}_{self.words[0]:016x})"


def generator(low_key: int, high_key: int) -> np.random.Generator:
    """A `numpy.random.Generator` at the start of the stream of key ``high_key << 64 | low_key``."""
    # NumPy's stubs name SeedSequence; Philox accepts any ISeedSequence at run time.
    key = Key(low_key, high_key)
    return np.random.Generator(np.random.Philox(key, counter=_ZERO_COUNTER))  # type: ignore[arg-type]


def move(
    philox: np.random.BitGenerator, low_key: int, high_key: int, words: int = 0,
    has_half: bool = False, half: int = 0,
) -> None:
    """Puts `philox` after `words` words of the stream of key ``high_key << 64 | low_key``,
    with NumPy's buffered 32-bit half-word (`has_half`, `half`) as given. A `Key` seed
    sequence of `philox` is set to the new key."""
    philox.state = {  # NumPy's setter takes any sequences
        "bit_generator": "Philox",
        "state": {"counter": (words // WORDS, 0, 0, 0), "key": (low_key, high_key)},
        "buffer": (0, 0, 0, 0),
        "buffer_pos": WORDS,  # empty: the next word starts block words // 4
        "has_uint32": int(has_half),
        "uinteger": half,
    }
    if words % WORDS:  # into the block: it fills NumPy's block buffer
        philox.random_raw(words % WORDS)
    key = philox.seed_seq
    if isinstance(key, Key):
        key.words = (low_key, high_key)


def place(philox: np.random.BitGenerator) -> tuple[int, bool, int]:
    """(words drawn, whether a 32-bit half-word is buffered, that half-word) of `philox`,
    whose counter is below 2**64."""
    state = philox.state
    words = WORDS * int(state["state"]["counter"][0]) - WORDS + int(state["buffer_pos"])
    return max(words, 0), bool(state["has_uint32"]), int(state["uinteger"])
