"""Tests of the batch arithmetic of layouts with skipped ranges (pure Python, no TF).

Every function is checked against a brute-force definition: walk the positions one by
one, never take a skipped one, cut batches of `batch_size` consecutive live positions
that cross neither an epoch nor a skip, drop short ones with drop_remainder.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.core import history
from resumeloader.core import positions as _position


def _skipped(layout: _position.Layout, position: int) -> bool:
    return any(a <= position < b for a, b in layout.skips)


def _brute_batches(
    layout: _position.Layout, start: int, limit: int, horizon: int = 400
) -> list[tuple[int, int]]:
    """Up to `limit` batches ``(start, stop)`` from `start` before `horizon`, by the
    definition."""
    per_epoch, size = layout.records_per_epoch, layout.batch_size
    end = min(horizon, layout.end) if layout.end is not None else horizon
    out, at = [], start
    while at < end and len(out) < limit:
        if _skipped(layout, at):
            at += 1
            continue
        stop = at
        while (
            stop < end and stop - at < size and stop // per_epoch == at // per_epoch
            and not _skipped(layout, stop)
        ):
            stop += 1
        segment_start = at % per_epoch == 0 and not any(b == at for _, b in layout.skips)
        if stop - at < size and layout.drop_remainder and not (
            segment_start and stop - at == per_epoch
        ):
            at = stop
            continue
        out.append((at, stop))
        at = stop
    return out


layouts = st.builds(
    lambda per_epoch, size, drop, epochs, ranges: _position.Layout(
        per_epoch, min(size, per_epoch) if drop else size, drop, epochs,
        skips=history.merged((a, a + n) for a, n in ranges),
    ),
    st.integers(3, 13),
    st.integers(1, 5),
    st.booleans(),
    st.one_of(st.none(), st.integers(1, 4)),
    st.lists(st.tuples(st.integers(0, 45), st.integers(1, 14)), min_size=1, max_size=4),
)


@settings(max_examples=300, deadline=None)
@given(layouts, st.integers(0, 50))
def test_skipped_layout_batches_equal_the_definition(layout, start):
    """From any start, the cut batches are the definition's: no skipped position in any."""
    expected = _brute_batches(layout, start, 40)
    at, got = layout.normalise(start), []
    while (layout.end is None or at < layout.end) and len(got) < len(expected):
        stop = layout.batch_end(at)
        got.append((at, stop))
        at = layout.normalise(stop)
    assert got == expected
    assert not any(_skipped(layout, p) for a, b in got for p in range(a, b))


@settings(max_examples=300, deadline=None)
@given(layouts, st.integers(0, 50), st.integers(0, 30))
def test_skipped_layout_advance_equals_one_batch_at_a_time(layout, start, num_batches):
    """advance(p, n) is n single advances: the position after the n-th batch."""
    batches = _brute_batches(layout, start, num_batches + 1, 10**4)
    if num_batches < len(batches):
        expected = batches[num_batches][0]
    else:  # a finite layout ran out of batches (the horizon is far past 30 batches)
        assert layout.end is not None
        expected = layout.end
    assert layout.advance(start, num_batches) == expected


@settings(max_examples=200, deadline=None)
@given(layouts.filter(lambda layout: layout.end is not None), st.integers(0, 50))
def test_skipped_layout_batches_to_end_counts_the_batches(layout, start):
    """batches_to_end is the number of batches the definition cuts to the end."""
    assert layout.batches_to_end(layout.normalise(start)) == len(
        _brute_batches(layout, start, 10**6, 10**6)
    )


@settings(max_examples=200, deadline=None)
@given(layouts, st.integers(0, 50))
def test_skipped_layout_epoch_counts_are_the_definitions(layout, start):
    """batches_left_in_epoch and epoch_step count the epoch's batches after and before."""
    per_epoch = layout.records_per_epoch
    position = layout.normalise(start)
    epoch = position // per_epoch
    horizon = (epoch + 1) * per_epoch
    in_epoch = _brute_batches(layout, epoch * per_epoch, 10**6, horizon)
    left = _brute_batches(layout, position, 10**6, horizon)
    assert layout.batches_left_in_epoch(position) == len(left)
    before = [b for b in in_epoch if b[0] < position]
    if all(b[1] <= position or b[0] >= position for b in in_epoch):
        assert layout.epoch_step(position) == len(before)


def test_layout_without_skips_is_unchanged_by_the_skip_path():
    """A layout whose skips were removed computes exactly what the plain layout does."""
    plain = _position.Layout(10, 4, True, 3)
    assert plain.regular == plain
    assert [plain.advance(0, k) for k in range(8)] == [0, 4, 10, 14, 20, 24, 30, 30]
    assert plain.epoch_step(14) == 1


def test_skip_jumps_and_cuts_the_batch_before_it_short():
    """Batches of 4 with positions [6, 13) skipped: 0, 4 (short, ends at 6), 13, 17."""
    layout = _position.Layout(100, 4, False, None, skips=((6, 13),))
    assert [layout.advance(0, k) for k in range(5)] == [0, 4, 13, 17, 21]
    assert layout.batch_end(4) == 6
    assert layout.normalise(8) == 13
    assert layout.epoch_step(17) == 3


@pytest.mark.parametrize(
    ("skips", "expected"),
    [(((6, 13),), [0, 13, 17]), (((8, 13),), [0, 4, 13])],
    ids=["short-batch-dropped", "aligned-skip-drops-nothing"],
)
def test_skip_with_drop_remainder_drops_the_short_batch_before_it(skips, expected):
    """With drop_remainder a batch cut short by a skip is dropped like an epoch's last."""
    layout = _position.Layout(100, 4, True, None, skips=skips)
    assert [layout.advance(0, k) for k in range(3)] == expected
