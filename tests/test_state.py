"""Tests of the loader state dict and the position arithmetic (pure Python, no TF)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import ElasticResumeError, StateError, StateMismatchError, _position, _state


def _state_for(**changes):
    order = _state.order(num_records=100, seed=7, shuffle=True)
    state = _state.make(order, epoch=2, offset=40, shard_count=2, batch_size=8)
    state.update(changes)
    if set(changes) & set(_state.ORDER_FIELDS):
        state["fingerprint"] = _state.fingerprint(state)
    return state


def test_make_flat_json_of_ints_and_strs():
    """A state is a flat dict of ints and strs that survives a JSON round trip, under 1 KB."""
    state = _state_for()
    assert all(type(v) in (int, str) for v in state.values())
    text = _state.to_json(state)
    assert json.loads(text) == state
    assert len(text) < 1024


def test_parse_accepts_json_text():
    """parse reads the JSON text of a state as well as the dict."""
    state = _state_for()
    assert _state.parse(_state.to_json(state)) == state


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ([1, 2], "must be a dict"),
        ("{not json", "JSON"),
        ({"version": 99}, "version"),
        (dict(_state_for(), extra=1), "unknown fields: \\['extra'\\]"),
        (
            {k: v for k, v in _state_for().items() if k != "offset"},
            "Missing fields: \\['offset'\\]",
        ),
        (_state_for(offset=-3), "offset"),
        (_state_for(epoch="2"), "epoch"),
        (_state_for(shuffle=True), "shuffle"),
        (_state_for(batch_size=0), "batch_size"),
        (dict(_state_for(), seed=8), "fingerprint"),
    ],
    ids=[
        "list", "bad-json", "version", "extra-field", "missing-field", "negative", "str-int",
        "bool-int", "zero-batch", "edited-seed",
    ],
)
def test_parse_malformed_raises_state_error(state, match):
    """Malformed or edited states raise StateError (a ValueError) naming the problem."""
    with pytest.raises(StateError, match=match) as info:
        _state.parse(state)
    assert isinstance(info.value, ValueError)


def test_check_order_names_every_differing_field():
    """A mismatch names each differing order field on its own line."""
    saved = _state_for()
    expected = _state.order(num_records=101, seed=8, shuffle=True)
    with pytest.raises(StateMismatchError) as info:
        _state.check_order(saved, expected)
    lines = str(info.value).splitlines()
    assert "  num_records: checkpoint has 100, this loader has 101" in lines
    assert "  seed: checkpoint has 7, this loader has 8" in lines
    assert not any("shuffle" in line for line in lines)


def test_check_order_same_order_passes():
    """Equal order fields pass, whatever the batch size or shard count."""
    expected = _state.order(num_records=100, seed=7, shuffle=True)
    assert _state.check_order(_state_for(batch_size=3, shard_count=5), expected) is None


@pytest.mark.parametrize(
    ("offset", "shard_count", "expected"),
    [(40, 1, (2, 40)), (40, 4, (2, 10)), (40, 2, (2, 20)), (98, 2, (2, 49)), (99, 3, (3, 0)),
     (0, 8, (2, 0))],
    ids=["one", "four", "two", "two-tail", "past-kept", "start"],
)
def test_local_offset_converts_global_offset(offset, shard_count, expected):
    """A global offset becomes this layout's local offset, or the next epoch past the kept part."""
    assert _state.local_offset(
        _state_for(offset=offset), shard_count=shard_count, num_records=100
    ) == expected


def test_local_offset_not_divisible_raises_elastic_error():
    """A global offset the new shard count does not divide cannot continue exactly."""
    with pytest.raises(ElasticResumeError, match=r"offset=40.*shard_count=3"):
        _state.local_offset(_state_for(offset=40), shard_count=3, num_records=100)


# -- position arithmetic --------------------------------------------------------------------
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
