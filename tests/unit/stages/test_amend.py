"""Tests of amended pipelines without TensorFlow: mixture changes, skips in plans, lineage.

The stream is read through `Plan.tasks` (what every delivery path hands out) and the
index stage; lineage through `resumeloader.handout.lineage` with the plan's producer.
"""

from __future__ import annotations

import fractions

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import Pipeline, Shard
from resumeloader.core import history
from resumeloader.handout import lineage
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

WEB = np.arange(100, dtype=np.int64)
CODE = np.arange(1000, 1030, dtype=np.int64)
MATH = np.arange(5000, 5017, dtype=np.int64)


def _mix(shuffle: bool = True) -> Pipeline:
    return Pipeline.mix({"web": WEB, "code": CODE}, weights={"web": 0.7, "code": 0.3}, seed=4,
                        shuffle=shuffle)


def _keys(pipeline: Pipeline, stop: int) -> np.ndarray:
    """The record index at global positions [0, stop) (epochs are consecutive positions)."""
    stage = pipeline.index_stage
    positions = np.arange(stop, dtype=np.int64)
    epochs, offsets = np.divmod(positions, stage.num_records)
    return np.concatenate(
        [stage.indices(int(e), offsets[epochs == e], seed=pipeline.seed)
         for e in np.unique(epochs).tolist()]
    )


def _amended(pipeline: Pipeline, plan: list[tuple[int, dict[str, int], bool]]) -> Pipeline:
    """`pipeline` with each ``(at, weights, add math)`` change."""
    for at, weights, add in plan:
        pipeline = pipeline.amend(at, weights=weights, add={"math": MATH} if add else None)
    return pipeline


changes = st.lists(
    st.tuples(st.integers(1, 600), st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)),
    min_size=1, max_size=5, unique_by=lambda c: c[0],
).map(lambda items: sorted(items))


def _plan(items: list[tuple[int, int, int, int]]) -> list[tuple[int, dict[str, int], bool]]:
    out, added = [], False
    for at, web, code, math in items:
        weights = {"web": web, "code": code} | ({"math": math} if added or math else {})
        if not any(weights.values()):
            weights["web"] = 1
        out.append((at, weights, "math" in weights and not added))
        added = added or "math" in weights
    return out


@settings(max_examples=60, deadline=None)
@given(changes, st.booleans())
def test_amended_mixture_segments_hold_their_weights_and_sources_continue(items, shuffle):
    """Before the first change the stream is the base one; in every segment each prefix
    holds each source's weight to within one; each source walks on where it stood."""
    plan = _plan(items)
    base, amended = _mix(shuffle), _amended(_mix(shuffle), plan)
    horizon = 900
    keys = _keys(amended, horizon)
    first = plan[0][0]
    assert keys[:first].tolist() == _keys(base, first).tolist()
    located = [amended.source.locate(k) for k in keys.tolist()]
    bounds = [0, *(at for at, _, _ in plan), horizon]
    weights = [{"web": fractions.Fraction(7, 10), "code": fractions.Fraction(3, 10)}]
    for _, w, _ in plan:
        total = sum(w.values())
        weights.append({n: fractions.Fraction(v, total) for n, v in w.items()})
    for start, stop, segment in zip(bounds, bounds[1:], weights, strict=False):
        counts: dict[str, int] = {}
        for n, (name, _, _) in enumerate(located[start:stop], start=1):
            counts[name] = counts.get(name, 0) + 1
            for source, weight in segment.items():
                assert abs(counts.get(source, 0) - weight * n) < 1
    lengths = {"web": len(WEB), "code": len(CODE), "math": len(MATH)}
    seen: dict[str, list[tuple[int, int]]] = {}
    for name, lap, record in located:
        seen.setdefault(name, []).append((lap, record))
    for name, walk in seen.items():  # laps in order, each lap a permutation (prefix)
        laps = [lap for lap, _ in walk]
        assert laps == sorted(laps)
        assert laps == [n // lengths[name] for n in range(len(walk))]
        for lap in set(laps):
            records = [r for la, r in walk if la == lap]
            assert len(set(records)) == len(records)
            if not shuffle:
                assert records == list(range(len(records)))


def test_amended_mixture_counts_at_a_change_are_closed_form():
    """Each source's count at a change far out (10^12) comes from the quota's closed form."""
    amended = _mix().amend(10**12, weights={"web": 1, "code": 1})
    counts = amended.index_stage.counts(10**12 + 10)
    assert counts["web"] - 7 * 10**11 in (4, 5, 6) and sum(counts.values()) == 10**12 + 10
    assert amended.index_stage.num_records == _mix().index_stage.num_records


def test_added_source_changes_no_key_before_it_and_no_order_field():
    """Adding a source keeps every key (so every record's randomness) and the base fields."""
    base = _mix()
    amended = base.amend(50, weights={"web": 1, "code": 1, "math": 2}, add={"math": MATH})
    assert _keys(amended, 50).tolist() == _keys(base, 50).tolist()
    fields = dict(amended.order_fields())
    entries = fields.pop("history.amendments")
    assert fields == base.order_fields()
    assert entries.startswith("50m")
    assert {amended.source.locate(k)[0] for k in _keys(amended, 200)[50:].tolist()} == {
        "web", "code", "math"
    }


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"weights": {"web": 1}}, ValueError, r"missing \['code'\]"),
        ({"weights": {"web": 1, "code": 1, "x": 1}}, ValueError, r"unknown \['x'\]"),
        ({"weights": {"web": 0, "code": 0}}, ValueError, "at least one source"),
        ({"weights": {"web": 1, "code": -1}}, ValueError, "finite positive"),
        ({"weights": {"web": 1, "code": 1}, "add": {"web": WEB}}, ValueError, "already in"),
        ({"weights": [1, 2]}, TypeError, "mapping"),
    ],
    ids=["missing", "unknown", "all-zero", "negative", "name-taken", "not-a-mapping"],
)
def test_amend_bad_arguments_raise_naming_them(kwargs, error, message):
    """Bad amendments are refused with what was received."""
    with pytest.raises(error, match=message):
        _mix().amend(10, **kwargs)


def test_amend_of_a_single_source_pipeline_points_to_mix_and_skip():
    """amend needs a mixture; the message names the alternatives."""
    with pytest.raises(ValueError, match=r"Pipeline\.mix"):
        Pipeline(WEB, seed=0).amend(3, weights={"a": 1})


def test_added_source_must_fit_the_mixtures_records():
    """A source whose records do not fit the mixture's is refused."""
    with pytest.raises(ValueError, match="one structure"):
        _mix().amend(3, weights={"web": 1, "code": 1, "f": 1},
                     add={"f": np.zeros((5, 2), np.float32)})


def _positions(plan: plan_lib.Plan, start: int) -> list[list[int]]:
    out = []
    for task in plan.tasks(plan.layout.normalise(start)):
        out.append(list(range(task.position, task.position + len(task.indices))))
    return out


@pytest.mark.parametrize("shard", [0, 1], ids=["shard-0", "shard-1"])
def test_plan_skip_never_hands_out_the_skipped_positions_of_the_global_order(shard):
    """Shards of a skipped stream hand out exactly the unskipped global positions."""
    pipeline = Pipeline(np.arange(40), seed=1).shuffle().skip(12, 30).batch(3)
    plans = [plan_lib.Plan(pipeline, num_epochs=2, shard=Shard(s, 2)) for s in (0, 1)]
    plain = plan_lib.Plan(Pipeline(np.arange(40), seed=1).shuffle().batch(3), num_epochs=2,
                          shard=Shard(shard, 2))
    handed = [p for batch in _positions(plans[shard], 0) for p in batch]
    global_positions = [plans[shard].global_position(p) + shard for p in handed]
    assert not [g for g in global_positions if 12 <= g < 30]
    assert len(handed) == 40 - 9
    by_position = {t.position + k: int(i) for t in plain.tasks(0) for k, i in enumerate(t.indices)}
    assert [int(i) for t in plans[shard].tasks(0) for i in t.indices] == [
        by_position[p] for p in handed
    ]


def test_plan_skip_bounds_must_suit_the_shards_and_windows():
    """A skip bound between two shards' records, or inside a window, is refused."""
    with pytest.raises(ValueError, match="multiple of the shard count"):
        plan_lib.Plan(Pipeline(np.arange(40), seed=1).skip(3, 10).batch(2), num_epochs=1,
                      shard=Shard(0, 2))
    bucketed = Pipeline([np.zeros(n % 5 + 1) for n in range(40)], seed=1).skip(4, 16)
    with pytest.raises(ValueError, match="window boundaries"):
        plan_lib.Plan(bucketed.bucket_by_length(2, window=8), num_epochs=1)
    plan_lib.Plan(
        Pipeline([np.zeros(n % 5 + 1) for n in range(40)], seed=1).skip(8, 24)
        .bucket_by_length(2, window=8), num_epochs=1,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: _mix().amend(30, weights={"web": 1, "code": 1}).skip(40, 57).batch(4),
        lambda: Pipeline([np.arange(n % 6 + 1) for n in range(60)], seed=2)
        .shuffle().skip(16, 32).bucket_by_length(2, window=8),
        lambda: Pipeline([np.arange(n % 6 + 1) for n in range(60)], seed=2)
        .shuffle().pack(8, window=12, batch_size=2),
    ],
    ids=["mix-amended", "bucket-skip", "pack"],
)
def test_lineage_of_every_batch_equals_what_is_produced(make):
    """records_at of each batch's start holds the positions and indices the producer used."""
    plan = plan_lib.Plan(make(), num_epochs=2)
    producer = produce.BatchProducer(plan.pipeline)
    for task in plan.tasks(0):
        made = producer.batch(task)
        at, covered = task.position, []
        for number, count in enumerate(made.counts):
            [found] = lineage.records_at(plan, producer, steps=None, positions=[at])
            slots = [r["position"] - task.position for r in found.records]
            assert [r["index"] for r in found.records] == task.indices[slots].tolist()
            if made.rows is None:
                assert slots == list(range(count))
            else:  # a windowed stage's rows: their first records are the batch's
                assert {s for s in made.rows[number].tolist() if s >= 0} <= set(slots)
            covered += slots
            assert (found.start, found.stop) == (at, plan.layout.normalise(at + count))
            at += count
        assert sorted(covered) == list(range(len(task.indices)))


def test_lineage_of_steps_is_refused_for_batches_counting_their_records():
    """A packing stage's steps cannot be located without the windows before: refused."""
    pipeline = Pipeline([np.arange(3)] * 20, seed=0).pack(8, window=10, batch_size=2)
    plan = plan_lib.Plan(pipeline, num_epochs=1)
    with pytest.raises(TypeError, match="by its position"):
        lineage.records_at(plan, produce.BatchProducer(pipeline), steps=[3], positions=None)


amendment_lists = st.tuples(
    changes,
    st.lists(st.tuples(st.integers(0, 150), st.integers(1, 40)), max_size=3),
    st.integers(1, 7),
    st.integers(0, 80),
)


@settings(max_examples=60, deadline=None)
@given(amendment_lists)
def test_random_amendments_resume_anywhere_and_lineage_names_every_batch(case):
    """For random lists of mixture changes and skips: the batches from any restored
    position are the uninterrupted run's from there, no skipped position is handed out,
    and records_at of every batch (by step and by position) holds its records."""
    items, skip_ranges, batch_size, resume_step = case
    pipeline = _amended(_mix(), _plan(items))
    for start, stop in history_ranges(skip_ranges):
        pipeline = pipeline.skip(start, stop)
    plan = plan_lib.Plan(pipeline.batch(batch_size), num_epochs=2)
    producer = produce.BatchProducer(plan.pipeline)
    run = [(t.position, t.indices.tolist()) for t in plan.tasks(plan.layout.normalise(0))]
    skipped = {p for start, stop in history_ranges(skip_ranges) for p in range(start, stop)}
    assert not skipped & {p + k for p, indices in run for k in range(len(indices))}
    resume_step = min(resume_step, len(run))
    at = run[resume_step][0] if resume_step < len(run) else plan.layout.end
    assert at == plan.layout.advance(0, resume_step)
    resumed = [(t.position, t.indices.tolist()) for t in plan.tasks(at)]
    assert resumed == run[resume_step:]
    for step, (position, indices) in enumerate(run):
        by_step = lineage.records_at(plan, producer, steps=step, positions=None)
        by_position = lineage.records_at(plan, producer, steps=None, positions=[position])
        for [found] in (by_step, by_position):
            assert found.start == position
            assert [r["index"] for r in found.records] == indices
            assert [r["position"] for r in found.records] == list(
                range(position, position + len(indices))
            )


def history_ranges(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Disjoint skips from random ``(start, length)`` pairs (overlapping ones joined)."""
    return history.merged((start, start + length) for start, length in ranges)
