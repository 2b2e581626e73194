"""`SamplerStage`: the index stage of a plain pipeline, natural order or a seeded shuffle."""

from __future__ import annotations

import dataclasses

import numpy as np

from resumeloader.core import sampler
from resumeloader.stages import base, fields

__all__ = ["SamplerStage"]


@dataclasses.dataclass(frozen=True)
class SamplerStage(base.IndexStage):
    """Record ``permute(num_records, seed, epoch, offset)`` at each offset, or ``offset`` itself.

    Each epoch is a permutation of ``[0, num_records)`` computed offset by offset in
    O(1) (see `IndexSampler`); epochs are independent, keyed by (seed, epoch), the seed
    being the pipeline's (`indices` receives it).
    """

    name = "sampler"
    algorithm = sampler.ALGORITHM

    num_records: int = dataclasses.field(metadata=fields.meta(check=fields.count))
    #: Whether epochs are shuffled.
    shuffle: bool = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.flag, order=True)
    )

    def indices(self, epoch: int, offsets: np.ndarray, *, seed: int) -> np.ndarray:
        if not self.shuffle:
            return offsets
        return sampler.permute(self.num_records, seed, epoch, offsets)

    def describe(self) -> str:
        return f"IndexSampler: {'shuffled' if self.shuffle else 'in order'}"
