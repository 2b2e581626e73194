"""`QuotaSequence`: which of K sources fills each position, exact to within one record.

Given positive rational weights ``w_k = p_k / Q`` (``Q`` their least common
denominator, so ``sum(p_k) == Q``), every position ``n = 0, 1, 2, ...`` is assigned to
one source such that after *every* prefix of ``n`` positions each source ``k`` holds
``c_k(n)`` positions with ``|c_k(n) - w_k * n| < 1`` (the quota property).

The assignment is Balinski and Young's quota method, in integer arithmetic: position
``n`` goes to the source whose next record has the earliest ideal time
``(c_k + 1) / w_k`` among those whose upper quota admits one more (``c_k < w_k *
(n + 1)``); ties go to the lower source number. After ``Q`` positions every count is
exactly ``p_k`` and the choice rule is invariant under that shift, so the sequence
repeats with period ``Q``. One period is built once (O(Q K) integer steps, each
checked against both quota bounds, so the property is verified for every position of
every period, not assumed); the source at any position and how many positions that
source held before it are then two table reads: O(1) per position, no history.
"""

from __future__ import annotations

import decimal
import fractions
import functools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MAX_PERIOD", "QuotaSequence", "cached", "to_fraction"]

# The period is built in Python once per mixture: ~0.7 s at 2**20 for two sources.
MAX_PERIOD = 1 << 20


def to_fraction(name: str, value: Any) -> fractions.Fraction:
    """A positive weight as an exact fraction.

    Integers, `fractions.Fraction`, `decimal.Decimal` and strings (``"0.7"``,
    ``"7/10"``) are exact; a float (NumPy's too) is read as the shortest decimal that
    prints it (``0.7`` is 7/10, not the binary double nearest to it).

    Raises:
        TypeError: `value` is not a number or a string.
        ValueError: it is not finite and positive, or the string is not a number.
    """
    if isinstance(value, (bool, np.bool_)):
        msg = f"`{name}` must be a positive number. Received: {name}={value!r}."
        raise TypeError(msg)
    try:
        if isinstance(value, (numbers.Integral, fractions.Fraction, decimal.Decimal)):
            result = fractions.Fraction(value)
        elif isinstance(value, numbers.Real):
            if not math.isfinite(float(value)):
                raise ValueError(value)
            # The shortest decimal that prints the value in its own precision (float32 too).
            real = value if isinstance(value, np.floating) else float(value)
            result = fractions.Fraction(np.format_float_positional(real, unique=True, trim="-"))
        elif isinstance(value, str):
            result = fractions.Fraction(value.strip())
        else:
            msg = (
                f"`{name}` must be a positive number (int, float, Fraction, Decimal or a "
                f"string such as '7/10'). Received: {name}={value!r:.80} of type "
                f"{type(value).__name__}."
            )
            raise TypeError(msg)
    except (ValueError, ZeroDivisionError, decimal.InvalidOperation) as err:
        msg = f"`{name}` must be a finite positive number. Received: {name}={value!r:.80}."
        raise ValueError(msg) from err
    if result <= 0:
        msg = f"`{name}` must be a finite positive number. Received: {name}={value!r:.80}."
        raise ValueError(msg)
    return result


class QuotaSequence:
    """The quota sequence of positive rational weights (see the module docstring).

    Args:
        weights: one positive `fractions.Fraction` per source (not necessarily
            summing to 1: they are normalised).

    Raises:
        ValueError: no weight, or a period (the least common denominator of the
            normalised weights) above `MAX_PERIOD`.

    Examples:
        >>> from fractions import Fraction
        >>> quota = QuotaSequence([Fraction(7, 10), Fraction(3, 10)])
        >>> quota.period, quota.shares
        (10, (7, 3))
        >>> source, _ = quota.locate(np.arange(10))
        >>> source.tolist()
        [0, 0, 1, 0, 0, 1, 0, 0, 0, 1]
        >>> quota.counts(1_000_001)
        [700001, 300000]
    """

    def __init__(self, weights: Sequence[fractions.Fraction]) -> None:
        if not weights:
            msg = "A quota sequence needs at least one weight. Received: weights=[]."
            raise ValueError(msg)
        total = sum(weights, fractions.Fraction(0))
        normalised = [w / total for w in weights]
        period = math.lcm(*(w.denominator for w in normalised))
        if period > MAX_PERIOD:
            shown = ", ".join(str(w) for w in normalised)
            msg = (
                "The normalised weights need a common denominator of at most "
                f"{MAX_PERIOD:,}: it is the period after which the mixture repeats its "
                f"pattern. Received weights normalised to {shown:.300} (common denominator "
                f"{period:,}). Round the weights (e.g. to 4 decimal places) or pass small "
                "integers or Fractions."
            )
            raise ValueError(msg)
        self.period = period
        self.shares = tuple(int(w * period) for w in normalised)
        self.weights = tuple(normalised)
        source, before = _build(self.shares, period)
        self._source = np.asarray(source, dtype=np.min_scalar_type(len(weights) - 1))
        self._before = np.asarray(before, dtype=np.int32)
        self._shares = np.asarray(self.shares, dtype=np.int64)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The source at each position and how many positions it held before (int64 arrays).

        Args:
            positions: non-negative int64 positions.
        """
        cycles, phase = np.divmod(positions, self.period)
        source = self._source[phase].astype(np.int64)
        count = self._before[phase].astype(np.int64)
        count += cycles * self._shares[source]
        return source, count

    def counts(self, num_positions: int) -> list[int]:
        """Each source's count after the first `num_positions` positions, in closed form:
        O(#sources * log period), whatever `num_positions`."""
        cycles, phase = divmod(num_positions, self.period)
        head = [int(np.searchsorted(phases, phase)) for phases in self._phases()]
        return [cycles * share + extra for share, extra in zip(self.shares, head, strict=True)]

    def _phases(self) -> list[np.ndarray]:
        """Each source's positions in one period (sorted), built once."""
        phases = self.__dict__.get("_phase_lists")
        if phases is None:
            phases = [np.flatnonzero(self._source == k) for k in range(len(self.shares))]
            self.__dict__["_phase_lists"] = phases
        return phases

    def position_of(self, source: int, rank: int) -> int:
        """The position of source `source`'s record number `rank` (counted from 0)."""
        cycles, rest = divmod(rank, self.shares[source])
        return cycles * self.period + int(self._phases()[source][rest])


@functools.lru_cache(maxsize=256)
def cached(weights: tuple[fractions.Fraction, ...]) -> QuotaSequence:
    """The `QuotaSequence` of `weights`, built once per process (amended mixtures reuse
    the weights of their segments)."""
    return QuotaSequence(list(weights))


def _build(shares: tuple[int, ...], period: int) -> tuple[list[int], list[int]]:
    """One period: the source of each position and its count before it, quota-checked."""
    counts = [0] * len(shares)
    source, before = [0] * period, [0] * period
    indices = range(len(shares))
    for n in range(period):
        reach = n + 1
        best = -1
        for k in indices:
            count = counts[k]
            # Upper quota at n + 1: count + 1 <= ceil(w_k (n + 1)), i.e. count < w_k (n + 1).
            if count * period < shares[k] * reach and (
                best < 0 or (count + 1) * shares[best] < (counts[best] + 1) * shares[k]
            ):
                best = k
        # Lower quota at n for the source chosen: it held its count since its last turn,
        # and n is the latest prefix of that wait, so this covers every prefix of it.
        if (counts[best] + 1) * period <= shares[best] * n:
            msg = f"The quota method broke the lower quota: shares {shares}, position {n}."
            raise RuntimeError(msg)
        source[n], before[n] = best, counts[best]
        counts[best] += 1
    if tuple(counts) != shares:  # the lower quota of the prefixes after each last turn
        msg = f"The quota method ended a period off its shares: {shares} != {counts}."
        raise RuntimeError(msg)
    return source, before
