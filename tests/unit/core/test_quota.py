"""Tests of the quota sequence (the source at each position of a mixture) and weight parsing."""

from __future__ import annotations

import decimal
import fractions
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from resumeloader.core import quota

F = fractions.Fraction

weights_st = st.lists(
    st.fractions(min_value=F(1, 12), max_value=50, max_denominator=12), min_size=1, max_size=7
)


def _small_period(weights: list[F]) -> quota.QuotaSequence:
    """The sequence of `weights`, when its period is small enough to build quickly.

    A period is built in Python once per mixture (~0.7 s at 10**6): keep the
    properties fast by assuming periods up to 5,000.
    """
    total = sum(weights)
    assume(math.lcm(*(int((w / total).denominator) for w in weights)) <= 5_000)
    return quota.QuotaSequence(weights)


def _prefix_counts(sequence: quota.QuotaSequence, num_positions: int) -> np.ndarray:
    """Counts after every prefix 0..num_positions, by brute force over the sources."""
    source, _ = sequence.locate(np.arange(num_positions, dtype=np.int64))
    onehot = np.zeros((num_positions + 1, len(sequence.shares)), dtype=np.int64)
    onehot[np.arange(1, num_positions + 1), source] = 1
    return np.cumsum(onehot, axis=0)


@settings(max_examples=150, deadline=None)
@given(weights=weights_st)
def test_quota_every_prefix_count_within_one_of_weight(weights):
    """For every prefix n of three periods, |count_k(n) - w_k n| < 1, exactly (integers)."""
    sequence = _small_period(weights)
    length = 3 * sequence.period + 5
    counts = _prefix_counts(sequence, length)
    n = np.arange(length + 1, dtype=np.int64)[:, None]
    shares = np.asarray(sequence.shares, dtype=np.int64)[None, :]
    # |c - p n / Q| < 1  <=>  |c Q - p n| < Q
    assert (np.abs(counts * sequence.period - shares * n) < sequence.period).all()


@settings(max_examples=100, deadline=None)
@given(weights=weights_st, position=st.integers(0, 2**62))
def test_quota_far_position_counts_and_locate_agree(weights, position):
    """At any position: counts within one of w n, and `locate` is the source that advances."""
    sequence = _small_period(weights)
    before, after = sequence.counts(position), sequence.counts(position + 1)
    for count, weight in zip(before, sequence.weights, strict=True):
        assert abs(count - weight * position) < 1
    source, held = sequence.locate(np.array([position], dtype=np.int64))
    k = int(source[0])
    assert [a - b for a, b in zip(after, before, strict=True)] == [
        int(i == k) for i in range(len(before))
    ]
    assert int(held[0]) == before[k]


@settings(max_examples=60, deadline=None)
@given(weights=weights_st, data=st.data())
def test_quota_position_of_inverts_locate(weights, data):
    """position_of(k, j) is where source k's record j sits: locate gives (k, j) back."""
    sequence = _small_period(weights)
    k = data.draw(st.integers(0, len(weights) - 1))
    rank = data.draw(st.integers(0, 10**9))
    position = sequence.position_of(k, rank)
    source, held = sequence.locate(np.array([position], dtype=np.int64))
    assert (int(source[0]), int(held[0])) == (k, rank)


def test_quota_weights_are_normalised_and_periodic():
    """Integer weights 7 and 3 are 7/10 and 3/10: a period of 10, then the same pattern."""
    sequence = quota.QuotaSequence([F(7), F(3)])
    source, _ = sequence.locate(np.arange(30, dtype=np.int64))
    assert (sequence.period, sequence.shares) == (10, (7, 3))
    assert source[:10].tolist() == source[10:20].tolist() == source[20:].tolist()


def test_quota_period_above_limit_raises():
    """A common denominator above MAX_PERIOD is refused, naming it and what to do."""
    with pytest.raises(ValueError, match="common denominator") as info:
        quota.QuotaSequence([F(1, 2_000_003), F(1)])
    assert "2,000,004" in str(info.value)
    assert "Round the weights" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.7, F(7, 10)),
        (np.float32(0.7), F(7, 10)),
        (3, F(3)),
        (np.int64(2), F(2)),
        (F(1, 3), F(1, 3)),
        (decimal.Decimal("0.25"), F(1, 4)),
        ("7/10", F(7, 10)),
        (" 0.125 ", F(1, 8)),
    ],
    ids=["float", "float32", "int", "numpy-int", "fraction", "decimal", "ratio-str", "decimal-str"],
)
def test_to_fraction_numbers_exact_decimal_values(value, expected):
    """Every accepted kind is read exactly; floats as the decimal that prints them."""
    assert quota.to_fraction("w", value) == expected


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-0.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("seven", ValueError),
        ("1/0", ValueError),
        (True, TypeError),
        (None, TypeError),
        ([1], TypeError),
    ],
    ids=["zero", "negative", "nan", "inf", "word", "zero-denominator", "bool", "none", "list"],
)
def test_to_fraction_bad_value_raises_naming_it(value, error):
    """Non-positive, non-finite and non-numbers raise, naming the argument and the value."""
    with pytest.raises(error) as info:
        quota.to_fraction("weights['web']", value)
    assert f"weights['web']={value!r}"[:30] in str(info.value)
