"""The one restore path without TensorFlow: `resume` (a state's position, every refusal
before anything changes) and `state_of` (a position's state)."""

from __future__ import annotations

import json

import _windowed as w
import numpy as np
import pytest

from resumeloader import ElasticResumeError, Pipeline, Shard, StateError, StateMismatchError
from resumeloader.handout import resume
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce

_LENGTHS = w.lengths(48, seed=2, high=12)


def _plain(shard: Shard | None = None) -> Plan:
    return Plan(Pipeline(np.arange(10), seed=3).shuffle().batch(4), num_epochs=3, shard=shard)


def _bucket(shard: Shard | None = None) -> Plan:
    pipeline = Pipeline(w.tokens(_LENGTHS), seed=3).shuffle().bucket_by_length(
        4, window=12, mask=True
    )
    return Plan(pipeline, num_epochs=2, shard=shard)


def _tokens() -> Plan:
    pipeline = Pipeline(w.tokens(_LENGTHS), seed=3).shuffle().batch_by_tokens(24, window=16)
    return Plan(pipeline, num_epochs=2)


def _resume(plan: Plan, state) -> int:
    return resume.resume(plan, produce.BatchProducer(plan.pipeline), state)


def _state(plan: Plan, position: int = 4, **changes):
    """`plan`'s state at `position`, with `changes`; an order field changed keeps the
    fingerprint right (the state of another pipeline, not a corrupted one)."""
    state = dict(resume.state_of(plan, position), **changes)
    if any("." in key for key in changes):
        state["fingerprint"] = resume.state_lib.fingerprint(state)
    return state


def _without(key: str):
    state = _state(_plain())
    del state[key]
    return state


class _BadTokens:
    """Token records; reading an index in `bad` raises."""

    def __init__(self, records: list[np.ndarray], bad: set[int]) -> None:
        self.records, self.bad = records, bad

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> np.ndarray:
        if index in self.bad:
            msg = f"record {index} is corrupt"
            raise ValueError(msg)
        return self.records[index]


def _windowed_boundaries(plan: Plan) -> list[int]:
    """The positions after each batch of `plan`'s first window."""
    producer = produce.BatchProducer(plan.pipeline)
    task = next(plan.tasks(0))
    ends, at = [], 0
    for group in producer.groups(task, replacing=True):
        at += group.count
        ends.append(at)
    return ends


# -- refusals: each rule once, nothing restored ---------------------------------------
_REFUSED = {
    "not-a-dict": (_plain, [1, 2], StateError, "must be a dict"),
    "bad-json": (_plain, "{not json", StateError, "dict or its JSON text"),
    "not-utf8": (_plain, b"\xff\xfe", StateError, "is not text: it holds 2 bytes of binary data"),
    "too-long": (_plain, " " * 70_000, StateError, "under 1 KB"),
    "version": (_plain, _state(_plain(), version=3), StateError, "Unsupported .* version"),
    "missing-field": (_plain, _without("offset"), StateError, r"Missing fields: \['offset'\]"),
    "unknown-field": (
        _plain, _state(_plain(), extra=1), StateError, r"unknown fields: \['extra'\]"
    ),
    "bool-epoch": (_plain, _state(_plain(), epoch=True), StateError, "`epoch` must be an int"),
    "negative-offset": (_plain, _state(_plain(), offset=-4), StateError, r"in \[0, 2\*\*63\)"),
    "float-order-field": (
        _plain, _state(_plain(), **{"pipeline.seed": 3.0}), StateError, "an int or a str"
    ),
    "zero-shards": (_plain, _state(_plain(), shard_count=0), StateError, "must be >= 1"),
    "corrupted": (
        _plain, _state(_plain(), fingerprint="0" * 16), StateError, "fingerprint does not match"
    ),
    "other-seed": (
        _plain, _state(_plain(), **{"pipeline.seed": 4}), StateMismatchError,
        r"pipeline\.seed: checkpoint has 4, this loader has 3",
    ),
    "other-order": (
        _plain, _state(_plain(), **{"sampler.shuffle": 0}), StateMismatchError, "sampler.shuffle"
    ),
    "other-source": (
        _plain, _state(_plain(), **{"source.num_records": 11}), StateMismatchError,
        "source.num_records",
    ),
    "past-epoch-end": (_plain, _state(_plain(), offset=11), StateError, "past the end of an epoch"),
    "indivisible-offset": (
        lambda: _plain(shard=Shard(0, 2)), _state(_plain(), offset=3),
        ElasticResumeError, "not divisible",
    ),
    "past-2-63": (_plain, _state(_plain(), epoch=2**62), StateError, "out of range"),
    "window-other-shards": (
        lambda: _bucket(shard=Shard(0, 2)), _state(_bucket(), 8),
        ElasticResumeError, "inside a window with another shard count",
    ),
    "window-inside-batch-known": (
        _bucket, _state(_bucket(), 6), ElasticResumeError, r"inside a batch, .*\[4, 8\)",
    ),
}


@pytest.mark.parametrize("name", sorted(_REFUSED))
def test_resume_refused_state_raises_naming_the_rule(name):
    """Every rule of a restore refuses with its own error and message."""
    make, state, error, match = _REFUSED[name]
    with pytest.raises(error, match=match):
        _resume(make(), state)


def test_resume_inside_a_batch_of_data_dependent_window_raises():
    """Token budgets: a position inside a batch (only the window's data tells) is refused."""
    plan = _tokens()
    inside = _windowed_boundaries(plan)[1] - 1
    with pytest.raises(ElasticResumeError, match="lies inside a batch") as info:
        _resume(plan, _state(plan, inside))
    assert f"Received: position {inside} " in str(info.value)


def test_resume_past_a_skip_without_it_raises_state_mismatch():
    """A checkpoint past a skipped range restores only into a pipeline with that skip."""
    skipping = Plan(Pipeline(np.arange(10), seed=3).skip(4, 8).batch(2), num_epochs=2)
    plain = Plan(Pipeline(np.arange(10), seed=3).batch(2), num_epochs=2)
    with pytest.raises(StateMismatchError, match="skip"):
        _resume(plain, _state(skipping, 12))


def test_resume_version_1_state_with_a_wrong_fingerprint_raises():
    """A 0.1 state whose fields do not hash to its fingerprint is corrupted."""
    state = {
        "version": 1, "fingerprint": "0" * 16, "num_records": 10, "algorithm": "x",
        "shuffle": True, "seed": 3, "layout": "strided-v1", "epoch": 0, "offset": 0,
        "shard_count": 1, "batch_size": 4,
    }
    with pytest.raises(StateError, match="fingerprint does not match"):
        _resume(_plain(), state)


# -- what it accepts --------------------------------------------------------------------
@pytest.mark.parametrize("position", [0, 4, 8, 10, 14, 30], ids=lambda p: f"at-{p}")
def test_state_of_then_resume_gives_the_position(position):
    """`resume(state_of(p))` is p, through a JSON round trip, to the end of the stream."""
    plan = _plain()
    assert _resume(plan, json.dumps(resume.state_of(plan, position))) == position


def test_resume_with_another_shard_count_continues_the_global_order():
    """Two shards' state at global offset 4 is one shard's position 4 (elastic)."""
    two = _plain(shard=Shard(1, 2))
    assert _resume(_plain(), resume.state_of(two, 2)) == 4


def test_resume_at_an_epoch_end_moves_to_the_next_epoch():
    """An offset at the end of the records a layout keeps is the next epoch's start."""
    state = _state(_plain(), epoch=0, offset=9)  # 3 shards keep 9 of the 10 records
    assert _resume(_plain(shard=Shard(0, 3)), state) == 3


def test_resume_at_each_batch_end_of_a_data_dependent_window_is_accepted():
    """Token budgets: every batch end of a window restores to itself."""
    plan = _tokens()
    ends = _windowed_boundaries(plan)
    assert [_resume(plan, _state(plan, end)) for end in ends] == ends


def test_resume_inside_a_window_with_replaced_records_checks_the_replacing_batches(tmp_path):
    """With a bad-record policy, the window is grouped with its replacements (no error)."""
    source = _BadTokens(w.tokens(_LENGTHS), {0, 1, 2})
    spec = Pipeline(w.tokens(_LENGTHS), seed=3).source.record_spec()  # int64[None]
    pipeline = Pipeline(source, seed=3, output_signature=spec).on_error(
        "skip", max_fraction=0.5, quarantine=tmp_path / "q.jsonl"
    )
    plan = Plan(pipeline.batch_by_tokens(24, window=16), num_epochs=1)
    ends = _windowed_boundaries(plan)
    assert _resume(plan, _state(plan, ends[0])) == ends[0]
    assert not (tmp_path / "q.jsonl").exists()  # a check: nothing logged
