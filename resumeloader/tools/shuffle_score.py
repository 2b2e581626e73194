"""`ShuffleScore`: how well an order shuffles, from its batches, in O(batch) per batch.

Two figures, each 0 for the storage order and about 1 for a uniformly random
permutation (the ideal), computed from the batches of an order as they stream by:

* **moved**: how far records move from their storage order. The mean distance
  ``|position - record|`` over the scored positions, divided by what a uniformly
  random record would give at those positions (``sum_r |r - p| / N`` at position
  ``p``, about ``N / 3`` on average over an epoch).
* **mixed**: how many batches a run of neighbouring records spans. Cut the storage
  order into runs of `run` consecutive records (the batch size: the records that
  would form one batch unshuffled); a batch drawn from ``k`` runs puts a piece of each
  of them in it, and summing ``k`` over the batches counts (run, batch) pairs, so the
  mean number of batches a run spans is ``sum_k * run / records``: 1 unshuffled, and
  what `ideal_spread` gives for a random permutation. *mixed* is
  ``(spread - 1) / (ideal - 1)``.

`score` is the smaller of the two: an order is as good as its weaker side (the block
order moves records anywhere at chunk granularity but keeps a chunk's records within
one window; tf.data's ``shuffle(buffer)`` mixes neighbours but moves records only
about a buffer's length). Positions are offsets in an epoch of `num_records`
records; records are indices in ``[0, num_records)``. Pure NumPy.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["ScoreCounter", "ShuffleScore", "ideal_spread"]


@dataclasses.dataclass(frozen=True)
class ShuffleScore:
    """How well an order shuffles (see the module docstring).

    Attributes:
        moved: mean distance moved over a random order's, 0 unshuffled, ~1 ideal.
        spread: mean number of batches a run of `run` neighbouring records spans.
        ideal_spread: the same for a uniformly random permutation.
        mixed: ``(spread - 1) / (ideal_spread - 1)``, 0 unshuffled, ~1 ideal.
        positions: how many positions were scored.
    """

    moved: float
    spread: float
    ideal_spread: float
    mixed: float
    positions: int

    @property
    def score(self) -> float:
        """The weaker of `moved` and `mixed`."""
        return min(self.moved, self.mixed)

    def to_dict(self) -> dict[str, float | int]:
        """The figures as a JSON-serialisable dict (`score` included)."""
        return {**dataclasses.asdict(self), "score": self.score}


def ideal_spread(num_records: int, batch_size: int, run: int) -> float:
    """The mean number of batches of `batch_size` that a run of `run` neighbouring records
    spans under a uniformly random permutation of `num_records` records (full batches)."""
    batch = min(batch_size, num_records)

    def absent(size: int) -> float:  # P(a batch holds none of a run of `size` records)
        if num_records - size < batch:
            return 0.0
        log = (
            math.lgamma(num_records - size + 1) - math.lgamma(num_records - size - batch + 1)
            - math.lgamma(num_records + 1) + math.lgamma(num_records - batch + 1)
        )
        return math.exp(log)

    full, rest = divmod(num_records, run)
    runs_per_batch = full * (1 - absent(run)) + (1 - absent(rest) if rest else 0.0)
    return runs_per_batch * run / batch


class ScoreCounter:
    """Accumulates `ShuffleScore` over the batches of one order, O(batch) per batch.

    Args:
        num_records: records of an epoch (positions and records lie in ``[0, N)``).
        run: the length of a run of neighbouring records (the batch size).
    """

    def __init__(self, num_records: int, run: int) -> None:
        self.num_records, self.run = int(num_records), max(1, int(run))
        self._moved = self._expected = 0.0
        self._pairs = self._positions = 0
        self._batch_sizes: dict[int, int] = {}

    def add(self, positions: np.ndarray, records: np.ndarray) -> None:
        """One batch: its epoch offsets and the records at them."""
        p = np.asarray(positions, dtype=np.float64)
        r = np.asarray(records, dtype=np.int64) % self.num_records
        n = float(self.num_records)
        self._moved += float(np.abs(p - r).sum())
        self._expected += float((p * (p + 1) / 2 + (n - 1 - p) * (n - p) / 2).sum() / n)
        self._pairs += len(np.unique(r // self.run))
        self._positions += len(r)
        self._batch_sizes[len(r)] = self._batch_sizes.get(len(r), 0) + 1

    def result(self) -> ShuffleScore:
        """The score of the batches added so far.

        Raises:
            ValueError: no batch was added.
        """
        if not self._positions:
            msg = "No batch was scored: the scored range holds no position."
            raise ValueError(msg)
        batch = max(self._batch_sizes, key=self._batch_sizes.__getitem__)
        spread = self._pairs * self.run / self._positions
        ideal = ideal_spread(self.num_records, batch, self.run)
        mixed = (spread - 1) / (ideal - 1) if ideal > 1 else 1.0
        moved = self._moved / self._expected if self._expected else 0.0
        return ShuffleScore(moved, spread, ideal, max(0.0, mixed), self._positions)
