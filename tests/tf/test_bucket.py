"""Pipeline.bucket_by_length: windows sorted by length, batches counting batch_size positions."""

from __future__ import annotations

import _windowed as w
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import (
    ElasticResumeError,
    Pipeline,
    ResumableLoader,
    ResumeMismatchError,
    Shard,
    StateMismatchError,
    testing,
)
from resumeloader.stages.batching import bucket

pytestmark = pytest.mark.usefixtures("clean_keras")

LENGTHS = w.lengths(50, seed=2)


def _pipeline(batch_size: int = 4, window: int = 12, **kwargs) -> Pipeline:
    return Pipeline(w.tokens(LENGTHS), seed=3).shuffle().bucket_by_length(
        batch_size, window=window, mask=True, **kwargs
    )


def _records(batch) -> list[int]:
    values, mask = batch
    return [w.record_of(row[0]) for row in w.unpad(np.asarray(values), np.asarray(mask))]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=60),
    batch_size=st.integers(1, 8),
    drop=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
)
def test_property_bucket_window_holds_every_record_once(lengths, batch_size, drop, seed):
    """Every record of a window is in exactly one batch, whole (the short batch last, or
    dropped); full batches hold batch_size records of adjacent lengths."""
    window = -(-len(lengths) // batch_size) * batch_size
    stage = bucket.BucketStage(
        batch_size, window=window, drop_remainder=drop, pad_to=None, pad_value=-1, mask=True,
        truncate=False,
    )
    columns = [w.tokens(lengths)]
    groups = stage.group(columns, w.TOKENS, seed=seed, epoch=1, window=0)
    seen = []
    for group in groups:
        values, mask = stage.assemble_group(columns, w.TOKENS, group)
        rows = w.unpad(values, mask)
        assert all(v == -1 for row, keep in zip(values, mask, strict=True) for v in row[~keep])
        seen += rows
    kept = len(lengths) - (len(lengths) % batch_size if drop else 0)
    assert len(seen) == kept and len({tuple(r) for r in seen}) == kept
    assert all(r in [t.tolist() for t in columns[0]] for r in seen)
    assert [g.count for g in groups[:-1]] == [batch_size] * (len(groups) - 1)
    assert sum(g.count for g in groups) == kept


def test_bucket_batches_hold_records_of_similar_length():
    """Each batch pads to its longest record: far less padding than consecutive batches."""
    bucketed = list(ResumableLoader.from_pipeline(_pipeline(), num_epochs=1))
    plain = list(ResumableLoader.from_pipeline(
        Pipeline(w.tokens(LENGTHS), seed=3).shuffle().padded_batch(4, mask=True), num_epochs=1
    ))
    padding = [sum(int(np.size(m) - np.sum(m)) for _, m in run) for run in (bucketed, plain)]
    assert padding[0] < padding[1] / 2


def test_bucket_epoch_holds_every_record_once_in_batch_count_of_batch():
    """An epoch holds each record once, in as many batches as batch(4) makes; len agrees."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    assert len(loader) == loader.batches_per_epoch == 13
    batches = list(loader)
    assert len(batches) == 13
    assert sorted(r for b in batches for r in _records(b)) == list(range(50))


def test_bucket_batch_order_is_seeded_and_reproducible():
    """The same pipeline gives the same batches; another seed another order."""
    def stream(seed):
        pipeline = Pipeline(w.tokens(LENGTHS), seed=seed).bucket_by_length(4, window=12)
        return [b.numpy().tolist() for b in ResumableLoader.from_pipeline(pipeline, num_epochs=1)]

    assert stream(1) == stream(1)
    assert stream(1) != stream(2)


def test_bucket_graph_advance_is_the_fixed_batch_arithmetic():
    """advance() in a tf.function moves batch_size positions per batch, as for batch()."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=2)

    @tf.function
    def skip(n):
        loader.advance(n)

    skip(tf.constant(5, tf.int64))
    assert loader.position == 20
    skip(tf.constant(9, tf.int64))
    assert loader.position == 50 + 4  # 8 batches end epoch 0 (the last is short), 1 more


def test_bucket_window_not_multiple_of_batch_size_raises():
    """A window that is not a multiple of batch_size is refused, naming both."""
    with pytest.raises(ValueError, match="must be a multiple of `batch_size`") as info:
        _pipeline(window=10)
    assert "Received: window=10, batch_size=4" in str(info.value)


def test_bucket_drop_remainder_drops_the_short_batch():
    """With drop_remainder an epoch has only full batches, as batch(drop_remainder) has."""
    loader = ResumableLoader.from_pipeline(_pipeline(drop_remainder=True), num_epochs=1)
    batches = list(loader)
    assert len(batches) == loader.batches_per_epoch == 12
    assert {b[0].shape[0] for b in batches} == {4}


def test_bucket_restore_between_batches_raises_at_set_state():
    """A position inside a batch of its window (an edited state) is refused before it moves."""
    loader = ResumableLoader.from_pipeline(_pipeline())
    state = dict(loader.get_state(), offset=6)
    with pytest.raises(ElasticResumeError, match="lies inside a batch") as info:
        loader.set_state(state)
    assert "positions [4, 8)" in str(info.value) and loader.position == 0


def test_bucket_other_batch_size_refused_as_order_field():
    """The batch size defines the grouping: another one is a StateMismatchError naming it."""
    saved = ResumableLoader.from_pipeline(_pipeline()).get_state()
    other = ResumableLoader.from_pipeline(_pipeline(batch_size=6))
    with pytest.raises(StateMismatchError, match=r"bucket\.batch_size: checkpoint has 4"):
        other.set_state(saved)
    assert other.position == 0


def test_bucket_other_shard_count_inside_window_raises():
    """Inside a window, another shard count cannot continue exactly: refused."""
    loader = ResumableLoader.from_pipeline(_pipeline(), shard=Shard(0, 2))
    saved = dict(ResumableLoader.from_pipeline(_pipeline()).get_state(), offset=8)
    with pytest.raises(ElasticResumeError, match="another shard count") as info:
        loader.set_state(saved)
    assert "4 into its window" in str(info.value) and loader.position == 0


def test_bucket_other_shard_count_at_window_boundary_continues_without_loss():
    """From a window boundary of the new layout, two shards read exactly the rest."""
    single = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    single.advance(6)  # 24 records: 12 per shard, a window boundary for both layouts
    state = single.get_state()
    records = []
    for shard in range(2):
        loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, shard=Shard(shard, 2))
        loader.set_state(state)
        records += [r for b in loader for r in _records(b)]
    order = single.plan.indices(0, 0, 50).tolist()
    assert sorted(records) == sorted(order[24:])


def test_bucket_dataset_input_context_refused():
    """Distributed input cannot split bucketed windows exactly: refused."""
    loader = ResumableLoader.from_pipeline(_pipeline(drop_remainder=True))
    with pytest.raises(ValueError, match="windowed batch stage") as info:
        loader.dataset(input_context=tf.distribute.InputContext(2, 0, 2))
    assert "bucket_by_length(4, window 12" in str(info.value)


class _CallCountingBucket(bucket.BucketStage):
    """Broken on purpose: its batch order depends on how many windows it has grouped."""

    def __init__(self) -> None:
        super().__init__(2, window=6, drop_remainder=False, pad_to=None, pad_value=0,
                         mask=False, truncate=False)
        object.__setattr__(self, "calls", [0])  # a stage is frozen: state needs a way round

    def group(self, columns, spec, *, seed, epoch, window):
        self.calls[0] += 1
        return super().group(columns, spec, seed=seed + self.calls[0], epoch=epoch, window=window)


def test_history_dependent_windowed_stage_fails_the_conformance_check():
    """A windowed stage whose batches depend on its history is caught by the check."""
    def make() -> ResumableLoader:
        pipeline = Pipeline(w.tokens(LENGTHS[:20]), seed=0).apply(_CallCountingBucket())
        return ResumableLoader.from_pipeline(pipeline, num_epochs=2)

    with pytest.raises(ResumeMismatchError, match="differs from the uninterrupted run") as info:
        testing.assert_resumes_identically(make, num_steps=7)
    assert "restored at break point" in str(info.value)
