"""Randomness keyed by a record, never by history: `record_rng` and per-record TF seeds.

Every random choice made for a record comes from a generator keyed by (seed, epoch,
record index), so it is the same whatever order records are produced in, whatever
threads, workers or restores happened before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
from numpy.random import bit_generator

from resumeloader.core import sampler

__all__ = ["BATCH_STREAM", "RecordRngs", "metadata", "record_rng"]

_RNG_TAG = 0xA06_3E17_A71_0F_5EED
_METADATA_SEED_TAG = 0x7F5EED
_M64 = (1 << 64) - 1
#: XORed into the seed for the generators of a batch-level stage (`RecordRngs`): a
#: record's stream there is independent of the `rng` a ``map_fn`` gets for it.
BATCH_STREAM = 0x5EED_BA7C_0000_0001
# Philox copies its counter in; passing it as an array skips an int-to-words conversion.
_ZERO_COUNTER = np.zeros(4, np.uint64)


@functools.lru_cache(maxsize=64)
def _epoch_word(seed: int, epoch: int) -> int:
    return sampler.epoch_hash(seed ^ _RNG_TAG, epoch)


class _RecordKey(bit_generator.ISeedSequence):
    """The 128-bit Philox key of one record, given to Philox as its seed sequence.

    ``Philox(key=k)`` also builds a `numpy.random.SeedSequence` from OS entropy that it
    then discards (about two thirds of its cost); given a seed sequence instead, Philox
    takes its key from ``generate_state(2, uint64)``: the same key, the same stream.
    """

    __slots__ = ("_words",)

    def __init__(self, low: int, high: int) -> None:
        self._words = (low, high)

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> Any:
        """The key as `n_words` words of `dtype`, least significant first (128 bits)."""
        if n_words == 2 and dtype is np.uint64:  # what Philox asks for, per record
            return np.array(self._words, np.uint64)
        key = self._words[0] | self._words[1] << 64
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
        return self._words

    def __setstate__(self, words: tuple[int, int]) -> None:
        self._words = words

    def __repr__(self) -> str:
        return f"RecordKey(0x{self._words[1]:016x}_{self._words[0]:016x})"


def record_rng(seed: int, epoch: int, record_index: int) -> np.random.Generator:
    """The generator handed to ``map_fn`` for one record: a pure function of its arguments.

    A Philox stream keyed by (seed, epoch, record index): independent of the order
    records are produced in, of threads, workers and restores. Its key is
    ``epoch_hash(seed ^ tag, epoch) << 64 | record_index``, the counter starts at 0.

    Examples:
        >>> a = record_rng(7, 0, 12).integers(1000, size=3)
        >>> b = record_rng(7, 0, 12).integers(1000, size=3)
        >>> bool((a == b).all())
        True
    """
    if not 0 <= record_index <= _M64:
        msg = f"`record_index` must be in [0, 2**64). Received: record_index={record_index!r}."
        raise ValueError(msg)
    key = _RecordKey(int(record_index), _epoch_word(seed, epoch))
    # NumPy's stubs name SeedSequence; Philox accepts any ISeedSequence at run time.
    return np.random.Generator(np.random.Philox(key, counter=_ZERO_COUNTER))  # type: ignore[arg-type]


def metadata(seed: int, indices: np.ndarray, epoch: int, position: int) -> dict[str, np.ndarray]:
    """Per-record ``index``, ``epoch``, ``position`` and stateless TF ``seed`` pair of a batch.

    Args:
        seed: the pipeline's seed.
        indices: the batch's record indices (int64).
        epoch: the epoch of the batch.
        position: the position of the batch's first record.
    """
    count = len(indices)
    seeds = np.empty((count, 2), dtype=np.int64)
    seeds[:, 0] = np.int64(sampler.epoch_hash(seed ^ _METADATA_SEED_TAG, epoch) >> 1)
    seeds[:, 1] = indices
    return {
        "index": indices,
        "epoch": np.full(count, epoch, dtype=np.int64),
        "position": np.arange(position, position + count, dtype=np.int64),
        "seed": seeds,
    }


class RecordRngs(Sequence[np.random.Generator]):
    """One `numpy.random.Generator` per row of a batch, each keyed by (seed, epoch,
    the row's record index): what ``Pipeline.map_batch`` hands its function.

    Row ``i``'s generator is ``record_rng(seed ^ BATCH_STREAM, epoch, indices[i])``:
    a pure function of the record, so it is the same in any batch, any batch size,
    any worker and after any restore, and independent of the ``rng`` a ``map_fn``
    gets for the same record. Generators are made when first used. The helpers draw
    one value (or one array of `shape`) per row from that row's generator and stack
    them, so ``rngs.uniform(shape=(2,))[i]`` is what row ``i``'s generator alone gives.

    Args:
        seed: the pipeline's seed.
        epoch: the batch's epoch.
        indices: the record index of each row (int64).
    """

    __slots__ = ("_generators", "epoch", "indices", "seed")

    def __init__(self, seed: int, epoch: int, indices: np.ndarray) -> None:
        self.seed, self.epoch = seed, epoch
        self.indices = np.asarray(indices, dtype=np.int64)
        self._generators: list[np.random.Generator | None] = [None] * len(self.indices)

    def __len__(self) -> int:
        return len(self._generators)

    @overload
    def __getitem__(self, row: int) -> np.random.Generator: ...

    @overload
    def __getitem__(self, row: slice) -> list[np.random.Generator]: ...

    def __getitem__(self, row: int | slice) -> Any:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        generator = self._generators[row]
        if generator is None:
            index = int(self.indices[row])
            generator = record_rng(self.seed ^ BATCH_STREAM, self.epoch, index)
            self._generators[row] = generator
        return generator

    def __iter__(self) -> Iterator[np.random.Generator]:
        return (self[i] for i in range(len(self)))

    def _stack(self, draw: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = np.empty((len(self), *shape), dtype=dtype)
        for i, generator in enumerate(self):
            out[i] = draw(generator)
        return out

    def random(self, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Floats in [0, 1), ``[rows, *shape]``: row ``i`` is ``self[i].random(shape)``."""
        return self._stack(lambda g: g.random(shape), shape, np.float64)

    def uniform(self, low: float = 0.0, high: float = 1.0,
                shape: tuple[int, ...] = ()) -> np.ndarray:
        """``self[i].uniform(low, high, shape)`` for each row ``i``, stacked."""
        return self._stack(lambda g: g.uniform(low, high, shape), shape, np.float64)

    def normal(self, loc: float = 0.0, scale: float = 1.0,
               shape: tuple[int, ...] = ()) -> np.ndarray:
        """``self[i].normal(loc, scale, shape)`` for each row ``i``, stacked."""
        return self._stack(lambda g: g.normal(loc, scale, shape), shape, np.float64)

    def integers(self, low: int, high: int | None = None,
                 shape: tuple[int, ...] = ()) -> np.ndarray:
        """``self[i].integers(low, high, shape)`` (int64) for each row ``i``, stacked."""
        return self._stack(lambda g: g.integers(low, high, shape), shape, np.int64)

    def __repr__(self) -> str:
        return f"RecordRngs(seed={self.seed}, epoch={self.epoch}, rows={len(self)})"
