"""Tests of the position arithmetic of fixed-size batches (pure Python, no TF)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.core import positions as _position


def test_layout_advance_partial_last_batch_then_next_epoch():
    """Batches of 4 over 10 records: 0, 4, 8 (short), then the next epoch at 10."""
    layout = _position.Layout(10, 4, False, None)
    assert [layout.advance(0, k) for k in range(5)] == [0, 4, 8, 10, 14]


def test_layout_advance_drop_remainder_skips_short_batch():
    """With drop_remainder the short batch is skipped: 0, 4, then 10."""
    layout = _position.Layout(10, 4, True, None)
    assert [layout.advance(0, k) for k in range(4)] == [0, 4, 10, 14]
    assert layout.normalise(8) == 10


def test_layout_advance_stops_at_end():
    """A finite layout never advances past its end."""
    layout = _position.Layout(10, 4, False, 2)
    assert layout.advance(0, 100) == 20
    assert layout.batches_left_in_epoch(20) == 0


def test_layout_batches_never_cross_epochs_after_elastic_start():
    """Batches cut from an unaligned start still end at the epoch boundary."""
    layout = _position.Layout(10, 4, False, None)
    assert layout.batch_end(7) == 10
    assert layout.batches_left_in_epoch(7) == 1


@settings(max_examples=100, deadline=None)
@given(
    per_epoch=st.integers(1, 50),
    batch=st.integers(1, 60),
    drop=st.booleans(),
    first=st.integers(0, 30),
    second=st.integers(0, 30),
)
def test_property_advance_is_additive(per_epoch, batch, drop, first, second):
    """Advancing by a then by b equals advancing by a + b."""
    if drop and batch > per_epoch:
        batch = per_epoch
    layout = _position.Layout(per_epoch, batch, drop, None)
    assert layout.advance(layout.advance(0, first), second) == layout.advance(0, first + second)


def _iterative_advance(layout: _position.Layout, position: int, num_batches: int) -> int:
    """The definition of advancing: one batch at a time (what the O(1) form must equal)."""
    position = layout.normalise(position)
    for _ in range(num_batches):
        if layout.end is not None and position >= layout.end:
            break
        position = layout.normalise(layout.batch_end(position))
    return position


@settings(max_examples=300, deadline=None)
@given(
    per_epoch=st.integers(1, 40),
    batch=st.integers(1, 50),
    drop=st.booleans(),
    num_epochs=st.one_of(st.none(), st.integers(1, 4)),
    position=st.integers(0, 200),
    num_batches=st.integers(0, 60),
)
def test_property_advance_equals_iterative_definition(
    per_epoch, batch, drop, num_epochs, position, num_batches
):
    """The O(1) advance equals advancing one batch at a time, from any position."""
    layout = _position.Layout(per_epoch, batch, drop, num_epochs)
    assert layout.advance(position, num_batches) == _iterative_advance(
        layout, position, num_batches
    )


def test_layout_advance_huge_count_endless_is_exact():
    """advance(10**12) on an endless stream is exact arithmetic (14 batches per epoch)."""
    layout = _position.Layout(100, 7, True, None)
    expected = (10**12 // 14) * 100 + (10**12 % 14) * 7
    assert layout.advance(0, 10**12) == expected


def test_layout_advance_past_largest_position_raises_value_error():
    """An endless stream advanced past 2**63 - 1 records raises instead of overflowing."""
    layout = _position.Layout(100, 7, True, None)
    with pytest.raises(ValueError) as excinfo:
        layout.advance(0, 2**62)
    assert "passes the largest position, 2**63 - 1" in str(excinfo.value)


@pytest.mark.parametrize(
    ("position", "bounds"),
    [(0, (0, 8)), (7, (0, 8)), (8, (8, 10)), (10, (10, 18)), (29, (28, 30))],
    ids=["start", "inside", "second-window", "next-epoch", "last-short-window"],
)
def test_layout_window_bounds_align_to_epoch_start(position, bounds):
    """Windows of 8 over epochs of 10 records: [0, 8), [8, 10), then the next epoch's."""
    layout = _position.Layout(10, 4, False, None, window=8)
    assert layout.window_bounds(position) == bounds


@pytest.mark.parametrize(
    "call",
    [
        lambda layout: layout.advance(0, 1),
        lambda layout: layout.batch_end(0),
        lambda layout: layout.batches_per_epoch,
        lambda layout: layout.batches_left_in_epoch(0),
    ],
    ids=["advance", "batch_end", "batches_per_epoch", "batches_left_in_epoch"],
)
def test_layout_unknown_counts_refuse_batch_arithmetic(call):
    """Batches that count the records they hold have no arithmetic: it raises, naming it."""
    layout = _position.Layout(10, 4, False, None, window=8, known_counts=False)
    with pytest.raises(ValueError, match="count the records they hold") as info:
        call(layout)
    assert "Layout." in str(info.value)
    assert layout.normalise(10) == 10  # normalising needs no batch sizes
