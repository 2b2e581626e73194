"""The sampled digest of in-memory columns: pinned, and the same however the array is laid out."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader.sources import digest

_ARRAY = np.arange(300_000, dtype=np.float32).reshape(1000, 300)
# Computed by 0.3 (`array.flat` for every array): the rule may not change.
_PINNED = "8eaee895e048200a4eb8671c6b17db79"


def test_columns_digest_numeric_array_pinned():
    """The digest of a numeric column is pinned (a state's `source.identity` depends on it)."""
    assert digest.columns_digest([_ARRAY]) == "sampled-v1:" + _PINNED


@pytest.mark.parametrize(
    "layout", [np.asfortranarray, lambda a: np.ascontiguousarray(a[::-1])[::-1]],
    ids=["fortran-order", "reversed-view"],
)
def test_columns_digest_any_memory_layout_same_digest(layout):
    """An array laid out otherwise in memory (not C-contiguous) with the same values,
    dtype and shape has the same digest."""
    other = layout(_ARRAY)
    assert not other.flags.c_contiguous
    assert digest.columns_digest([other]) == digest.columns_digest([_ARRAY])


def test_columns_digest_sampled_element_changed_differs():
    """A change at a sampled element (the last) changes the digest."""
    changed = _ARRAY.copy()
    changed[-1, -1] += 1
    assert digest.columns_digest([changed]) != digest.columns_digest([_ARRAY])
