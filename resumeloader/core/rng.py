"""Randomness keyed by a record, never by history: `record_rng` and per-record TF seeds.

Every random choice made for a record comes from a generator keyed by (seed, epoch,
record index), so it is the same whatever order records are produced in, whatever
threads, workers or restores happened before.
"""

from __future__ import annotations

import numpy as np

from resumeloader.core import sampler

__all__ = ["metadata", "record_rng"]

_RNG_TAG = 0xA06_3E17_A71_0F_5EED
_METADATA_SEED_TAG = 0x7F5EED


def record_rng(seed: int, epoch: int, record_index: int) -> np.random.Generator:
    """The generator handed to ``map_fn`` for one record: a pure function of its arguments.

    A Philox stream keyed by (seed, epoch, record index): independent of the order
    records are produced in, of threads, workers and restores.

    Example:
        >>> a = record_rng(7, 0, 12).integers(1000, size=3)
        >>> b = record_rng(7, 0, 12).integers(1000, size=3)
        >>> bool((a == b).all())
        True
    """
    key = (sampler.epoch_hash(seed ^ _RNG_TAG, epoch) << 64) | record_index
    return np.random.Generator(np.random.Philox(key=key))


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
