"""Tests of the data history: amendments, their state entry and the check of the past (no TF)."""

from __future__ import annotations

import fractions

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import errors
from resumeloader.core import history
from resumeloader.core import state as state_lib

F = fractions.Fraction


def _change(at: int, web: int = 1, code: int = 1) -> history.MixChange:
    return history.MixChange(at, (("code", F(code)), ("web", F(web))))


amendments = st.one_of(
    st.builds(_change, st.integers(0, 10**10), st.integers(0, 5), st.integers(1, 5)),
    st.builds(lambda a, n: history.Skip(a, a + n), st.integers(0, 10**10), st.integers(1, 10**4)),
)


def _history(items: list[history.Amendment]) -> history.History:
    """A valid history from `items`: later duplicates of a position or overlaps dropped."""
    kept: list[history.Amendment] = []
    for item in items:
        try:
            history.History((*kept, item))
        except ValueError:
            continue
        kept.append(item)
    return history.History(tuple(kept))


def test_history_entries_are_compact_and_sorted_by_position():
    """One entry per amendment, by position: <at>m<digest> and <start>s<length>."""
    made = history.History((history.Skip(500, 800), _change(100)))
    assert made.entries() == f"100m{_change(100).digest()},500s300"
    assert [e[:2] for e in history.parse_entries(made.entries())] == [(100, "m"), (500, "s")]


def test_state_with_sixteen_amendments_stays_under_one_kilobyte():
    """A two-source mixture's state with 16 amendments at 10^10-scale positions is < 1 KB."""
    made = history.History(
        tuple(_change(10**10 + k * 10**7, 1 + k % 3) for k in range(8))
        + tuple(history.Skip(2 * 10**10 + k * 10**7, 2 * 10**10 + k * 10**7 + 5000)
                for k in range(8))
    )
    order = {
        "pipeline.seed": 2**63, "source.num_records": 10**10,
        "source.code.num_records": 4 * 10**9, "source.code.identity": "sampled-v1:" + "a" * 32,
        "source.web.num_records": 6 * 10**9, "source.web.identity": "sampled-v1:" + "b" * 32,
        "mix.algorithm": "quota-jefferson-v1", "mix.permutation": "feistel-radix-mul-r4-v1",
        "mix.weights": "code:2/5,web:3/5", "mix.shuffle": 1, "mix.records_per_epoch": 10**10,
        "shards.layout": "strided-v1", **made.order_fields(),
    }
    state = state_lib.make(order, epoch=3, offset=10**9, shard_count=8, batch_size=4096)
    assert len(state_lib.to_json(state)) <= 1024
    assert state_lib.parse(state_lib.to_json(state)) == state


def test_history_refuses_two_changes_at_one_position_and_overlapping_skips():
    """Ambiguous histories are refused, naming the positions."""
    with pytest.raises(ValueError, match="same position") as raised:
        history.History((_change(7), _change(7, 2)))
    assert "position 7" in str(raised.value)
    with pytest.raises(ValueError, match=r"\[10, 20\) and \[15, 30\)"):
        history.History((history.Skip(10, 20), history.Skip(15, 30)))


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: history.Skip(5, 5), ValueError),
        (lambda: history.Skip(-1, 5), ValueError),
        (lambda: history.MixChange(3, (("a", F(0)),)), ValueError),
        (lambda: history.MixChange("3", (("a", F(1)),)), TypeError),  # type: ignore[arg-type]
    ],
    ids=["empty-skip", "negative", "no-positive-weight", "not-an-int"],
)
def test_amendment_bad_values_raise(make, error):
    """A skip of nothing, a negative position, no positive weight, a non-integer refused."""
    with pytest.raises(error):
        make()


def test_check_past_names_missing_changed_and_extra_amendments():
    """Every difference before the checkpoint's position is named, one per line."""
    saved = history.History((_change(100), history.Skip(200, 300), _change(250, 3))).entries()
    mine = history.History((_change(100, 2), _change(150), history.Skip(400, 500)))
    with pytest.raises(errors.StateMismatchError) as raised:
        history.check_past(saved, mine, past_end=350)
    text = str(raised.value)
    assert "changed: the checkpoint's mixture change at 100" in text
    assert "this pipeline has at 100: weights code 1/3, web 2/3" in text
    assert "missing here: the checkpoint's skip of positions [200, 300)" in text
    assert "missing here: the checkpoint's mixture change at 250" in text
    assert "not in the checkpoint: at 150: weights code 1/2, web 1/2 (added at a position " in text
    assert "[400, 500)" not in text  # in the future of the checkpoint


def test_check_past_of_a_state_without_history():
    """A state of a pipeline without amendments restores where all of them lie ahead."""
    mine = history.History((_change(100), history.Skip(200, 300)))
    history.check_past(None, mine, past_end=100)
    with pytest.raises(errors.StateMismatchError, match="not in the checkpoint: at 100"):
        history.check_past(None, mine, past_end=101)


@pytest.mark.parametrize("text", ["12x3", "12m", "m12", "1s2,,", "12mXYZ0000000"])
def test_parse_entries_refuses_malformed_text(text):
    """A malformed history field is a StateError naming the entry."""
    with pytest.raises(errors.StateError, match=history.FIELD):
        history.parse_entries(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(amendments, max_size=12), st.lists(amendments, max_size=6),
       st.integers(0, 2 * 10**10))
def test_check_past_accepts_any_future_and_refuses_any_past_change(items, future, position):
    """Amendments at or after the position may differ freely; one changed before it is named."""
    saved = _history(items)
    past = [a for a in saved.amendments if a.position < position]
    ahead = [a for a in future if a.position >= position]
    mine = _history(past + ahead)
    if len([a for a in mine.amendments if a.position < position]) == len(past):
        history.check_past(saved.entries(), mine, past_end=position)
    if past:
        dropped = history.History(tuple(past[1:]))
        with pytest.raises(errors.StateMismatchError) as raised:
            history.check_past(saved.entries(), dropped, past_end=position)
        assert f"{past[0].position:,}" in str(raised.value)


def test_merged_joins_touching_and_overlapping_ranges():
    """Local skip ranges are merged into sorted disjoint ones."""
    assert history.merged([(5, 9), (0, 2), (9, 12), (1, 3), (20, 20)]) == ((0, 3), (5, 12))
