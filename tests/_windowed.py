"""Token records whose values name them, for the tests of the padding, bucketing,
packing and token-budget stages: record i holds ``(i + 1) * 1000 + 0, 1, ...``."""

from __future__ import annotations

import numpy as np
import optree

from resumeloader.core import spec as spec_lib

SCALE = 1000
TOKENS = spec_lib.RecordSpec(optree.tree_structure(0), (spec_lib.LeafSpec((None,), np.int64),))


def tokens(lengths) -> list[np.ndarray]:
    """One int64 sequence per length; record i is ``(i + 1) * SCALE + arange(length)``."""
    return [(i + 1) * SCALE + np.arange(n, dtype=np.int64) for i, n in enumerate(lengths)]


def lengths(count: int, seed: int, high: int = 40) -> list[int]:
    """`count` lengths in [1, high], seeded."""
    return np.random.default_rng(seed).integers(1, high + 1, count).tolist()


def record_of(value: int) -> int:
    """The record a token value came from."""
    return value // SCALE - 1


def unpad(values: np.ndarray, mask: np.ndarray) -> list[list[int]]:
    """The rows of a padded batch without their padding."""
    return [row[keep].tolist() for row, keep in zip(values, mask, strict=True)]
