"""Tests of the position arithmetic of fixed-size batches (pure Python, no TF)."""

from __future__ import annotations

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
