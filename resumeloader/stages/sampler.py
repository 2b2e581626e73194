"""The index stage of every plain pipeline: natural order, or a seeded shuffle per epoch."""

from __future__ import annotations

import numpy as np

from resumeloader.core import sampler
from resumeloader.stages import base

__all__ = ["SamplerStage"]


class SamplerStage(base.IndexStage):
    """Record ``permute(num_records, seed, epoch, offset)`` at each offset, or ``offset`` itself.

    Each epoch is a permutation of ``[0, num_records)`` computed offset by offset in
    O(1) (see `IndexSampler`); epochs are independent, keyed by (seed, epoch).
    """

    name = "sampler"

    def __init__(self, num_records: int, *, seed: int, shuffle: bool) -> None:
        self._num_records = num_records
        self._seed = seed
        self._shuffle = shuffle

    @property
    def num_records(self) -> int:
        return self._num_records

    @property
    def shuffle(self) -> bool:
        """Whether epochs are shuffled."""
        return self._shuffle

    def indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        if not self._shuffle:
            return offsets
        return sampler.permute(self._num_records, self._seed, epoch, offsets)

    def order_fields(self) -> base.Fields:
        return {"algorithm": sampler.ALGORITHM, "shuffle": int(self._shuffle)}

    def describe(self) -> str:
        order = "shuffled" if self._shuffle else "in order"
        return f"IndexSampler: {order}, seed {self._seed}"
