"""Tests of the loader state dict (pure Python, no TF): version 2, the 0.1 upgrade, checks."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from resumeloader import ElasticResumeError, StateError, StateMismatchError
from resumeloader.core import state as _state

_ORDER = {
    "pipeline.seed": 7,
    "source.num_records": 100,
    "sampler.algorithm": "feistel-radix-mul-r4-v1",
    "sampler.shuffle": 1,
    "shards.layout": "strided-v1",
}
_V01 = json.loads((Path(__file__).parents[2] / "fixtures" / "v0_1" / "state.json").read_text())


def _state_for(**changes):
    state = _state.make(dict(_ORDER), epoch=2, offset=40, shard_count=2, batch_size=8)
    state.update(changes)
    if any("." in key for key in changes):
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


def test_parse_version_1_state_upgrades_to_version_2_fields():
    """A 0.1 state becomes a version 2 state with the same position and stage-named fields."""
    upgraded = _state.parse(_V01["state"])
    assert upgraded["version"] == 2
    assert (upgraded["epoch"], upgraded["offset"], upgraded["row"]) == (1, 32, 0)
    assert upgraded["pipeline.seed"] == 3
    assert upgraded["source.num_records"] == 100
    assert upgraded["fingerprint"] == _state.fingerprint(upgraded)


def test_parse_version_1_state_edited_raises_state_error():
    """An edited order field of a 0.1 state is caught by its version 1 fingerprint."""
    with pytest.raises(StateError, match="fingerprint"):
        _state.parse(dict(_V01["state"], seed=4))


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ([1, 2], "must be a dict"),
        ("{not json", "JSON"),
        ("[" * 100_000, "JSON"),
        ("[" * 20_000, "JSON"),
        ({"version": 99}, "version"),
        ({"version": True}, "version"),
        (dict(_state_for(), extra=1), "unknown fields: \\['extra'\\]"),
        (
            {k: v for k, v in _state_for().items() if k != "offset"},
            "Missing fields: \\['offset'\\]",
        ),
        (_state_for(offset=-3), "offset"),
        (_state_for(epoch="2"), "epoch"),
        (_state_for(epoch=2**63), "epoch"),
        (_state_for(epoch=10**30), "epoch"),
        (_state_for(**{"sampler.shuffle": True}), "shuffle"),
        (_state_for(**{"sampler.seed": [1]}), "seed"),
        (_state_for(batch_size=0), "batch_size"),
        (dict(_state_for(), **{"pipeline.seed": 8}), "fingerprint"),
    ],
    ids=[
        "list", "bad-json", "long-json", "deep-json", "version", "bool-version", "extra-field",
        "missing-field", "negative", "str-int", "epoch-2-63", "epoch-huge", "bool-int",
        "list-field", "zero-batch", "edited-seed",
    ],
)
def test_parse_malformed_raises_state_error(state, match):
    """Malformed or edited states raise StateError (a ValueError) naming the problem."""
    with pytest.raises(StateError, match=match) as info:
        _state.parse(state)
    assert isinstance(info.value, ValueError)


def test_check_order_names_every_differing_stage_field():
    """A mismatch names each differing stage.field on its own line."""
    expected = dict(_ORDER, **{"source.num_records": 101, "pipeline.seed": 8})
    with pytest.raises(StateMismatchError) as info:
        _state.check_order(_state_for(), expected)
    lines = str(info.value).splitlines()
    assert "  source.num_records: checkpoint has 100, this loader has 101" in lines
    assert "  pipeline.seed: checkpoint has 7, this loader has 8" in lines
    assert not any("shuffle" in line for line in lines)


def test_check_order_stage_only_one_side_has_is_named():
    """A stage present in only one of the pipelines is named with its fields."""
    expected = dict(_ORDER, **{"mix.weights": "a=1/2,b=1/2"})
    with pytest.raises(StateMismatchError) as info:
        _state.check_order(_state_for(), expected)
    assert "  mix.weights: checkpoint has none, this loader has 'a=1/2,b=1/2'" in str(info.value)
    assert "stages mix differ" in str(info.value)


def test_check_order_same_order_passes():
    """Equal order fields pass, whatever the batch size or shard count."""
    assert _state.check_order(_state_for(batch_size=3, shard_count=5), dict(_ORDER)) is None


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




def test_parse_edited_position_accepted_by_design_edited_order_field_refused():
    """The fingerprint covers the order fields only: an edited epoch/offset is a valid state
    at another position (moving a state by hand is supported); an edited order field is not."""
    moved = _state.parse(dict(_state_for(), epoch=5, offset=8))
    _state.check_order(moved, dict(_ORDER))
    edited_order = dict(_state_for(), **{"pipeline.seed": 8})  # fingerprint left as saved
    with pytest.raises(StateError) as info:
        _state.parse(edited_order)
    assert (moved["epoch"], moved["offset"], moved["fingerprint"]) == (
        5, 8, _state_for()["fingerprint"]
    )
    assert "fingerprint" in str(info.value)


def test_check_order_identity_missing_in_checkpoint_accepted_with_warning():
    """A checkpoint without a source identity (0.1, 0.2) restores; a warning says so."""
    saved = _state_for()
    expected = {**_ORDER, "source.identity": "sampled-v1:ab", "source.web.identity": "x"}

    with pytest.warns(UserWarning, match=r"source\.identity, source\.web\.identity"):
        _state.check_order(saved, expected)


def test_check_order_identity_differs_refused_naming_it():
    """Two identities that differ are refused like any order field."""
    saved = _state_for(**{"source.identity": "sampled-v1:ab"})

    with pytest.raises(StateMismatchError, match=r"source\.identity: checkpoint has 'sampled-v1"):
        _state.check_order(saved, {**_ORDER, "source.identity": "sampled-v1:cd"})


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (pickle.dumps({"version": 2, "epoch": 0}), "a Python pickle (protocol"),
        (b"\x00\xff\xfe binary \x81", "bytes of binary data"),
        (json.dumps(_state_for())[:40], "truncated JSON"),
        (json.dumps(_state_for())[:40].encode(), "truncated JSON"),
        ("version=2, epoch=0", "text that is not JSON"),
    ],
    ids=["pickle", "binary", "truncated-json", "truncated-json-bytes", "not-json"],
)
def test_parse_value_that_is_no_loader_json_raises_state_error_naming_it(value, found):
    """A checkpoint value that is not a loader's JSON is a StateError saying what it is."""
    with pytest.raises(StateError) as info:
        _state.parse(value)
    assert found in str(info.value)
    assert "Received" in str(info.value)


@pytest.mark.parametrize("key", ["source.versions", "source.web.versions"])
def test_check_order_versions_against_digests_compares_the_rest_with_a_warning(key):
    """A checkpoint naming objects by versions restores into a loader naming them by
    content digests (data moved) and the reverse, after the other fields match."""
    digests = key.replace("versions", "digests")
    saved = _state.make(dict(_ORDER, **{key: "v1"}), epoch=2, offset=40, shard_count=2,
                        batch_size=8)
    with pytest.warns(UserWarning, match="only the files' names, sizes and record layouts"):
        _state.check_order(saved, dict(_ORDER, **{digests: "d1"}))
    back = _state.make(dict(_ORDER, **{digests: "d1"}), epoch=2, offset=40, shard_count=2,
                       batch_size=8)
    with pytest.warns(UserWarning, match="identifies the data by content"):
        _state.check_order(back, dict(_ORDER, **{key: "v1"}))
    with pytest.raises(StateMismatchError) as info:  # other digests, or no identity at all
        _state.check_order(back, dict(_ORDER, **{digests: "d2"}))
    assert f"{digests}: checkpoint has 'd1', this loader has 'd2'" in str(info.value)


def test_check_order_explains_a_field_only_the_checkpoint_has():
    """`explain` is asked about a field the loader lacks too (e.g. the versions of objects
    now read from a local copy), and its words follow the field's line."""
    saved = _state.make(dict(_ORDER, **{"source.versions": "v1"}), epoch=2, offset=40,
                        shard_count=2, batch_size=8)
    with pytest.raises(StateMismatchError) as info:
        _state.check_order(saved, dict(_ORDER), explain=lambda key, value: f"why {key}={value}")
    lines = str(info.value).splitlines()
    assert lines[-2:] == [
        "  source.versions: checkpoint has 'v1', this loader has none",
        "    (why source.versions=v1)",
    ]
