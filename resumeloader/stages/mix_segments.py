"""`Segments` of an amended mixture: which source supplies each position, and its count.

A mixture with changes (`resumeloader.core.history.MixChange`) is a sequence of
segments: segment ``s`` runs from its change's position ``P_s`` (``P_0 = 0``) to the
next one, and fills its positions with the quota sequence of its own weights over
the sources active in it. Position ``g`` of segment ``s`` goes to the source that the
segment's quota sequence puts at ``g - P_s``; that source's record is the next one of
its walk: number ``C_s[k] + (its count in the segment before g)``, where ``C_s[k]`` is
what source ``k`` supplied before ``P_s``. ``C_s`` comes from the closed-form counts of
the earlier segments' quota sequences (`QuotaSequence.counts`, O(#sources) each), once
per mixture: nothing is replayed, so a position's record costs O(1) whatever the
history before it, and each source continues its own walk where it stood: nothing
supplied is repeated, nothing skipped. Every prefix of a segment holds each active
source's weight to within one record (the quota property, per segment).
"""

from __future__ import annotations

import fractions
from collections.abc import Sequence

import numpy as np

from resumeloader.core import quota

__all__ = ["Segments"]


class Segments:
    """Segments of an amended mixture over parts ``0 .. num_parts - 1``.

    Args:
        first: the quota sequence of the base weights (over parts ``0 .. len - 1``).
        num_parts: every part that is ever in the mixture (base and added).
        changes: ``(position, parts, weights)`` of each change, by position: the
            active parts from there on and their positive weights.
    """

    def __init__(
        self,
        first: quota.QuotaSequence,
        num_parts: int,
        changes: Sequence[tuple[int, tuple[int, ...], tuple[fractions.Fraction, ...]]],
    ) -> None:
        self.starts = np.array([0, *(at for at, _, _ in changes)], dtype=np.int64)
        self.quotas = [first, *(quota.cached(weights) for _, _, weights in changes)]
        self.active = [
            np.arange(len(first.shares), dtype=np.int64),
            *(np.array(parts, dtype=np.int64) for _, parts, _ in changes),
        ]
        before = [np.zeros(num_parts, dtype=np.int64)]
        for s in range(1, len(self.quotas)):
            counts = before[-1].copy()
            supplied = self.quotas[s - 1].counts(int(self.starts[s] - self.starts[s - 1]))
            counts[self.active[s - 1]] += np.array(supplied, dtype=np.int64)
            before.append(counts)
        #: Per segment, what each part supplied before it.
        self.before = before

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The part at each position and how many records it supplied before (int64)."""
        segment = np.searchsorted(self.starts, positions, side="right") - 1
        part = np.empty_like(positions)
        count = np.empty_like(positions)
        for s in np.unique(segment).tolist():
            where = np.flatnonzero(segment == s)
            source, held = self.quotas[s].locate(positions[where] - self.starts[s])
            part[where] = self.active[s][source]
            count[where] = self.before[s][part[where]] + held
        return part, count

    def counts(self, num_positions: int) -> list[int]:
        """Each part's records among the first `num_positions` positions."""
        s = int(np.searchsorted(self.starts, num_positions, side="right")) - 1
        counts = self.before[s].copy()
        supplied = self.quotas[s].counts(num_positions - int(self.starts[s]))
        counts[self.active[s]] += np.array(supplied, dtype=np.int64)
        return [int(c) for c in counts]
