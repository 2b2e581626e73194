"""The Philox streams of a batch's rows, drawn from together and each kept exactly in place.

`RowStreams` holds, per row, where its stream stands as NumPy's Philox would after the
same calls: the words drawn and the buffered 32-bit half-word. A `draw` takes every
row's next raw values at once from a cache of Philox blocks computed for all rows
together (`resumeloader.core.philox`), converts them (`resumeloader.core.draws`) and
advances the rows. A row whose first attempt is refused somewhere (a bounded
integer's rejection, a normal beyond the ziggurat's fast region) is finished from
that element on by a real generator set to the row's place, and the row's place is
read back from it. A row handed out as a real generator (`generator`) keeps its
stream in that generator from then on: its later draws are that generator's.

A Philox pass over the rows costs per array operation more than per row (about 130 us
for 128 rows, 270 us for 1024). So when a batch's keys are a view of a longer array
(the plan's chunk of an epoch's order), the first blocks of the `AHEAD_ROWS` rows from
there on are computed together and kept (the last `_RUNS_KEPT` runs, whatever thread
made them: tf.data calls a generator from more than one): the batches after it take
theirs from there. What is kept is Philox of the keys it was computed for, which are
kept too and compared with the batch's: a pure function, looked up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader.core import draws as draws_lib
from resumeloader.core import philox

__all__ = ["RowStreams"]

# Blocks (of 4 words) computed per row at least when the cache is refilled; one block
# holds three typical draws of one value per row (a block more costs ~40% more).
_MIN_BLOCKS = 1
# Words per row above which each row is drawn by NumPy's own Philox: array Philox
# costs ~40 ns a word at size, NumPy ~3 ns plus ~5 us a row to place a generator.
LARGE = 256
_LOW = np.uint64(0xFFFFFFFF)
#: Rows whose first blocks are computed at once when a batch's keys are a view of a
#: longer array (see the module docstring).
AHEAD_ROWS = 1024
# The `_Ahead` runs last computed, newest first: a tuple replaced whole (a thread that
# reads it meanwhile sees the old one; a run lost to a race is computed again).
_RUNS_KEPT = 4
_runs: tuple[_Ahead, ...] = ()


class _Ahead:
    """The first `count` blocks of a run of keys of one array (`base`) from `address` on."""

    __slots__ = ("address", "base", "blocks", "count", "high_key", "keys")

    def __init__(self, base: np.ndarray, address: int, keys: np.ndarray, high_key: int,
                 count: int) -> None:
        self.base, self.address, self.high_key, self.count = base, address, high_key, count
        self.keys = keys.copy()
        self.blocks = philox.blocks(self.keys, high_key, 0, count)
        self.blocks.flags.writeable = False  # read by the draws, never written

    def find(self, keys: np.ndarray, address: int, high_key: int,
             count: int) -> np.ndarray | None:
        """The first `count` blocks of `keys` (at `address`) if this run holds them."""
        at, rest = divmod(address - self.address, 8)
        rows = len(keys)
        if (high_key != self.high_key or rest or at < 0 or at + rows > len(self.keys)
                or count > self.count):
            return None
        if not np.array_equal(self.keys[at : at + rows], keys):
            return None
        return self.blocks[at : at + rows, : count * philox.WORDS]


def _ahead(keys: np.ndarray, high_key: int, count: int) -> np.ndarray | None:
    """The first `count` blocks of every key of `keys` (uint64), from the run kept in
    this thread, or from a new run of `AHEAD_ROWS` keys computed from `keys`' first on
    when `keys` is a view of a longer 1-d array of 8-byte integers; else None."""
    base = keys.base
    if (type(base) is not np.ndarray or base.ndim != 1 or base.dtype.kind not in "iu"
            or base.itemsize != 8 or not base.flags.c_contiguous
            or not keys.flags.c_contiguous or len(base) <= len(keys)):
        return None
    global _runs
    address = keys.__array_interface__["data"][0]
    runs = _runs
    for kept in runs:
        if kept.base is base:
            found = kept.find(keys, address, high_key, count)
            if found is not None:
                return found
    start, rest = divmod(address - base.__array_interface__["data"][0], 8)
    if rest or not 0 <= start <= len(base) - len(keys):
        return None
    run = base[start : start + max(AHEAD_ROWS, len(keys))].view(np.uint64)
    kept = _Ahead(base, address, run, high_key, count)
    _runs = (kept, *runs[: _RUNS_KEPT - 1])
    return kept.find(keys, address, high_key, count)


class RowStreams:
    """The streams of keys ``high_key << 64 | low_keys[i]``, one per row (see module).

    Args:
        low_keys: the low key word of each row (uint64).
        high_key: the high key word shared by the rows.
    """

    def __init__(self, low_keys: np.ndarray, high_key: int) -> None:
        self.low_keys = np.asarray(low_keys, np.uint64)
        self.high_key = high_key
        rows = len(self.low_keys)
        self._words = np.zeros(rows, np.int64)  # words drawn
        self._has_half = np.zeros(rows, bool)  # a 32-bit half-word is buffered
        self._half = np.zeros(rows, np.uint64)
        self._aligned = True  # every row at the same place
        self._cache: np.ndarray | None = None  # [rows, words] from word _cache_start on
        self._cache_start = 0
        self._owned: dict[int, np.random.Generator] = {}  # rows handed out
        self._scratch: np.random.Philox | None = None

    def __len__(self) -> int:
        return len(self.low_keys)

    # -- real generators ---------------------------------------------------------------
    def generator(self, row: int) -> np.random.Generator:
        """Row `row`'s stream as a `numpy.random.Generator` at its place; from now on the
        row's draws are that generator's (its stream lives there)."""
        owned = self._owned.get(row)
        if owned is None:
            owned = philox.generator(int(self.low_keys[row]), self.high_key)
            words, has_half = int(self._words[row]), bool(self._has_half[row])
            if words or has_half:
                philox.move(owned.bit_generator, int(self.low_keys[row]), self.high_key,
                            words, has_half, int(self._half[row]))
            self._owned[row] = owned
        return owned

    def _finish(self, row: int, call: Callable[[np.random.Generator], Any],
                place: tuple[int, bool, int]) -> Any:
        """``call`` on a generator at `place` of row `row`'s stream; the row then stands
        where the generator stopped."""
        if self._scratch is None:
            self._scratch = np.random.Philox(0)
        philox.move(self._scratch, int(self.low_keys[row]), self.high_key, *place)
        result = call(np.random.Generator(self._scratch))
        words, has_half, half = philox.place(self._scratch)
        self._words[row], self._has_half[row], self._half[row] = words, has_half, half
        self._aligned = False
        return result

    def _realign(self) -> None:
        """Notes whether every row stands at the same place again."""
        words, has_half = self._words, self._has_half
        self._aligned = bool((words == words[0]).all() and (has_half == has_half[0]).all())

    def each(self, call: Callable[[np.random.Generator], Any]) -> list[Any]:
        """``call(generator)`` for every row, in order, on a generator at the row's place."""
        results = []
        for row in range(len(self)):
            owned = self._owned.get(row)
            if owned is not None:
                results.append(call(owned))
            else:
                place = int(self._words[row]), bool(self._has_half[row]), int(self._half[row])
                results.append(self._finish(row, call, place))
        if results:
            self._realign()
        return results

    # -- drawing together -------------------------------------------------------------
    def draw(self, draw: draws_lib.Draw, count: int) -> np.ndarray:
        """The next `count` elements of `draw` of every row, ``[rows, count]``."""
        if count > LARGE:
            return np.stack(self.each(lambda g: draw.finish(g, count)))
        words, has_half, half = self._words, self._has_half, self._half
        if draw.bits == 64:
            raw = self._take(count)
        elif draw.bits == 32:
            raw = self._halves(count)
        else:
            raw = np.zeros((len(self), count), np.uint64)
        values, refused = draw.convert(raw)
        for row, owned in self._owned.items():
            values[row] = draw.finish(owned, count)
        if refused is not None and refused.any():
            stray: np.ndarray = np.asarray(refused.any(axis=1))
            if self._owned:
                stray[list(self._owned)] = False
            for row in np.flatnonzero(stray).tolist():
                element = int(np.argmax(refused[row]))
                place = _place_before(
                    element, int(words[row]), bool(has_half[row]), int(half[row]),
                    int(raw[row, element]), half_words=draw.bits == 32,
                )
                rest = functools.partial(_finish_with, draw, count - element)
                values[row, element:] = self._finish(row, rest, place)
            if stray.any():
                self._realign()
        return values

    def _take(self, count: int) -> np.ndarray:
        """Every row's next `count` words, ``[rows, count]`` (the rows advance)."""
        raw = self._peek(count)
        self._words = self._words + count
        return raw

    def _halves(self, count: int) -> np.ndarray:
        """Every row's next `count` 32-bit half-words (as uint64), buffered as NumPy does."""
        has_half = self._has_half
        uniform = self._aligned
        first = bool(has_half[0]) if len(has_half) else False
        fresh = count - first if uniform else count  # half-words from new words, at most
        words = self._peek((fresh + 1) // 2)
        halves = np.empty((len(self), 1 + 2 * words.shape[1]), np.uint64)
        halves[:, 0] = self._half
        np.bitwise_and(words, _LOW, out=halves[:, 1::2])
        np.right_shift(words, np.uint64(32), out=halves[:, 2::2])
        if uniform:
            raw = halves[:, 1 - first : 1 - first + count]
            odd = (count - first) % 2 == 1
            self._words = self._words + (count - first + 1) // 2
            self._has_half = np.full(len(self), odd)
            if odd:
                self._half = halves[:, 1 - first + count].copy()
            return raw
        raw = np.where(has_half[:, None], halves[:, :count], halves[:, 1 : count + 1])
        fresh_rows = count - has_half.astype(np.int64)
        self._words = self._words + (fresh_rows + 1) // 2
        odd = fresh_rows % 2 == 1
        after = np.minimum(1 - has_half.astype(np.intp) + count, halves.shape[1] - 1)
        self._half = np.where(odd, halves[np.arange(len(self)), after], 0).astype(np.uint64)
        self._has_half = odd
        return raw

    def _peek(self, count: int) -> np.ndarray:
        """Every row's next `count` words, ``[rows, count]``, from the block cache."""
        starts = self._words
        if count == 0:
            return np.empty((len(self), 0), np.uint64)
        if self._aligned:
            low = high = int(starts[0]) if len(starts) else 0
        else:
            low, high = int(starts.min()), int(starts.max())
        self._cover(low, high + count)
        assert self._cache is not None
        if self._aligned:
            at = low - self._cache_start
            return self._cache[:, at : at + count]
        columns = (starts - self._cache_start)[:, None] + np.arange(count)
        return self._cache[np.arange(len(self))[:, None], columns]

    def _cover(self, start: int, end: int) -> None:
        """Makes the cache hold words [start, end) of every row."""
        first, last = start // philox.WORDS, -(-end // philox.WORDS)
        cache, cached = self._cache, self._cache_start // philox.WORDS
        cached_end = cached + (0 if cache is None else cache.shape[1] // philox.WORDS)
        if cache is not None and cached <= first and last <= cached_end:
            return
        last = max(last, first + _MIN_BLOCKS)
        if cache is None and first == 0:
            found = _ahead(self.low_keys, self.high_key, last)
            if found is not None:
                self._cache, self._cache_start = found, 0
                return
        if cache is not None and cached <= first <= cached_end:
            kept = cache[:, (first - cached) * philox.WORDS :]
            more = philox.blocks(self.low_keys, self.high_key, cached_end, last - cached_end)
            self._cache = np.concatenate([kept, more], axis=1)
        else:
            self._cache = philox.blocks(self.low_keys, self.high_key, first, last - first)
        self._cache_start = first * philox.WORDS


def _finish_with(draw: draws_lib.Draw, count: int, generator: np.random.Generator) -> Any:
    return draw.finish(generator, count)


def _place_before(
    element: int, words: int, has_half: bool, half: int, value: int, *, half_words: bool
) -> tuple[int, bool, int]:
    """A row's place before its `element`-th element of a draw that started at (words,
    has_half, half); `value` is that element's raw value."""
    if not half_words:
        return words + element, has_half, half
    if has_half and element == 0:
        return words, True, half
    fresh = element - has_half  # half-words from new words before this one
    if fresh % 2 == 0:  # the low half of a new word
        return words + fresh // 2, False, 0
    return words + fresh // 2 + 1, True, value  # the high half, buffered after its word
