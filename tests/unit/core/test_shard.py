"""Shard: a frozen, self-checking option value."""

from __future__ import annotations

import dataclasses

import pytest

from resumeloader import Shard


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [((2, 2), ValueError, "`index` must be in [0, count)"), ((0, 0), ValueError, "`count`"),
     ((-1, 2), ValueError, "`index`"), ((0.5, 2), TypeError, "`index` must be an integer"),
     ((True, 2), TypeError, "`index`")],
    ids=["index-past-count", "no-shards", "negative", "float", "bool"],
)
def test_shard_invalid_raises_naming_field(args, error, fragment):
    """A shard outside [0, count) or not integral is refused on construction."""
    with pytest.raises(error) as info:
        Shard(*args)
    assert fragment in str(info.value) and "Received:" in str(info.value)


def test_shard_is_a_frozen_value():
    """Shards compare by value and cannot be changed."""
    shard = Shard(1, 3)
    assert shard == Shard(index=1, count=3) and hash(shard) == hash(Shard(1, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shard.index = 0  # type: ignore[misc]


def test_shard_records_per_epoch_refuses_more_shards_than_records():
    """Each shard needs a record per epoch."""
    assert Shard(0, 3).records_per_epoch(10) == 3
    with pytest.raises(ValueError, match="must not exceed `num_records`"):
        Shard(0, 11).records_per_epoch(10)
