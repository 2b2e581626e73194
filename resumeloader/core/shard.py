"""`Shard`: which part of each epoch's global order a loader reads (an option value)."""

from __future__ import annotations

import dataclasses

from resumeloader.core import validate

__all__ = ["Shard", "checked"]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: global offsets ``index, index + count, ...`` of each
    epoch (strided; each epoch drops its ``num_records % count`` tail).

    Frozen and checked on construction. The shard count is not an order field: a
    state saved with one count continues with another where the position allows it
    (elastic resume).

    Args:
        index: this shard, in [0, count).
        count: shards splitting each epoch's global order.

    Raises:
        TypeError, ValueError: `index` or `count` is not an integer, or not
            ``0 <= index < count``.

    Examples:
        >>> Shard(1, 3)
        Shard(index=1, count=3)
        >>> Shard(3, 3)
        Traceback (most recent call last):
        ...
        ValueError: `index` must be in [0, count). Received: index=3, count=3.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        index, count = validate.shard(self.index, self.count, names=("index", "count"))
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "count", count)

    def records_per_epoch(self, num_records: int) -> int:
        """This shard's records of an epoch of `num_records` records.

        Raises:
            ValueError: there are more shards than records.
        """
        if self.count > num_records:
            msg = (
                "`shard_count` must not exceed `num_records`: every shard needs a record "
                f"per epoch. Received: shard_count={self.count}, num_records={num_records}."
            )
            raise ValueError(msg)
        return num_records // self.count


def checked(shard: object, name: str = "shard") -> Shard:
    """`shard` if it is a `Shard`; else a `TypeError` naming argument `name`."""
    if not isinstance(shard, Shard):
        msg = (
            f"`{name}` must be a resumeloader.Shard, e.g. {name}=Shard(index, count). "
            f"Received: {name}={shard!r:.80} of type {type(shard).__name__}."
        )
        raise TypeError(msg)
    return shard
