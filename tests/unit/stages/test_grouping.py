"""Tests of the window grouping functions (pure NumPy): partitions, bounds, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.stages.batching import grouping

_LENGTHS = st.lists(st.integers(1, 300), min_size=1, max_size=200).map(
    lambda xs: np.asarray(xs, dtype=np.int64)
)


def _is_partition(groups, count):
    slots = np.concatenate(groups) if groups else np.empty(0, np.int64)
    return sorted(slots.tolist()) == list(range(count))


@settings(max_examples=200, deadline=None)
@given(lengths=_LENGTHS, batch_size=st.integers(1, 40))
def test_property_sorted_chunks_partition_into_known_count(lengths, batch_size):
    """Sorted chunks hold every slot once, ceil(n / batch_size) groups of <= batch_size."""
    groups = grouping.sorted_chunks(lengths, batch_size)
    assert _is_partition(groups, len(lengths))
    assert len(groups) == -(-len(lengths) // batch_size)
    assert all(len(g) <= batch_size for g in groups)
    longest = [int(lengths[g].max()) for g in groups]
    assert longest == sorted(longest)


@settings(max_examples=200, deadline=None)
@given(
    lengths=_LENGTHS,
    boundaries=st.lists(st.integers(1, 300), min_size=1, max_size=5, unique=True).map(
        lambda b: tuple(sorted(b))
    ),
    batch_size=st.integers(1, 40),
)
def test_property_boundary_buckets_keep_one_bucket_per_group(lengths, boundaries, batch_size):
    """Every group lies within one length bucket; every slot appears once."""
    groups = grouping.boundary_buckets(lengths, boundaries, batch_size)
    assert _is_partition(groups, len(lengths))
    for group in groups:
        buckets = set(np.searchsorted(boundaries, lengths[group], side="right").tolist())
        assert len(buckets) == 1 and len(group) <= batch_size


@settings(max_examples=200, deadline=None)
@given(lengths=_LENGTHS, max_tokens=st.integers(1, 2000), cap=st.none() | st.integers(1, 50))
def test_property_token_budget_groups_fit_the_budget(lengths, max_tokens, cap):
    """Each group's padded size fits the budget (a lone over-long record excepted)."""
    groups = grouping.token_budget(lengths, max_tokens, max_batch_size=cap)
    assert _is_partition(groups, len(lengths))
    for group in groups:
        padded = len(group) * int(lengths[group].max())
        assert padded <= max_tokens or len(group) == 1
        assert cap is None or len(group) <= cap


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 32)), min_size=1, max_size=120),
)
def test_property_first_fit_decreasing_bins_respect_capacity(lengths):
    """FFD bins hold every slot once and never exceed any leaf's capacity."""
    lengths = np.asarray(lengths, dtype=np.int64)
    capacities = np.array([64, 32])
    bins = grouping.first_fit_decreasing(lengths, capacities)
    assert _is_partition(bins, len(lengths))
    for b in bins:
        assert (lengths[b].sum(axis=0) <= capacities).all()


def test_first_fit_decreasing_is_first_fit_on_sorted_lengths():
    """Longest first, each into the first bin with room: the textbook FFD result."""
    bins = grouping.first_fit_decreasing(np.array([5, 4, 3, 3, 2, 2, 1]), np.array([8]))
    assert [b.tolist() for b in bins] == [[0, 2], [1, 3, 6], [4, 5]]


def test_first_fit_decreasing_record_longer_than_row_raises_naming_it():
    """A record that cannot fit an empty row is an error naming its slot and lengths."""
    with pytest.raises(ValueError, match=r"lengths \[9\] at slot 1.*capacity \[8\]"):
        grouping.first_fit_decreasing(np.array([3, 9]), np.array([8]))


def test_grouping_ties_broken_by_slot():
    """Equal lengths keep window order, so a window always groups the same way."""
    groups = grouping.sorted_chunks(np.array([2, 1, 2, 1]), 2)
    assert [g.tolist() for g in groups] == [[1, 3], [0, 2]]


@settings(max_examples=100, deadline=None)
@given(
    count=st.integers(0, 300),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 10**6),
    window=st.integers(0, 10**6),
)
def test_property_batch_order_is_a_seeded_permutation(count, seed, epoch, window):
    """The emission order of a window's groups is a permutation, the same on every call."""
    order = grouping.batch_order(count, seed=seed, epoch=epoch, window=window)
    assert sorted(order.tolist()) == list(range(count))
    again = grouping.batch_order(count, seed=seed, epoch=epoch, window=window)
    assert order.tolist() == again.tolist()


def test_batch_order_differs_between_windows_and_epochs():
    """Other windows and epochs of one seed get other orders."""
    orders = {
        tuple(grouping.batch_order(20, seed=1, epoch=e, window=w).tolist())
        for e in range(3)
        for w in range(3)
    }
    assert len(orders) == 9
