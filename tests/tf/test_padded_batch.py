"""Pipeline.padded_batch: consecutive positions, varying leaves padded into dense arrays."""

from __future__ import annotations

import _windowed as w
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import Pipeline, RecordSpecError, ResumableLoader, Shard, Workers
from resumeloader.stages.batching import padded

pytestmark = pytest.mark.usefixtures("clean_keras")

LENGTHS = w.lengths(23, seed=4)
DATA = {"tokens": w.tokens(LENGTHS), "label": np.arange(23), "text": [f"t{i}" for i in range(23)]}


def _loader(batch_size: int = 5, **kwargs) -> ResumableLoader:
    options = {"mask": True}
    options.update(kwargs)
    workers = {k: options.pop(k) for k in ("workers",) if k in options}
    pipeline = Pipeline(DATA, seed=5).shuffle().padded_batch(batch_size, **options)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=1, **workers)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    pad_to=st.none() | st.integers(1, 30),
    pad_value=st.integers(-5, 5),
)
def test_property_padded_batch_holds_every_record_once(lengths, pad_to, pad_value):
    """Each record is one row: its values, then pad_value; the mask marks its length
    (records longer than pad_to cut with truncate=True)."""
    stage = padded.PaddedBatchStage(
        len(lengths), drop_remainder=False, pad_to=pad_to, pad_value=pad_value, mask=True,
        truncate=True,
    )
    records = w.tokens(lengths)
    values, mask = stage.assemble([records], w.TOKENS)
    width = max(lengths) if pad_to is None else pad_to
    assert values.shape == (len(lengths), width)
    for row, keep, record in zip(values, mask, records, strict=True):
        assert row[keep].tolist() == record[:width].tolist()
        assert (row[~keep] == pad_value).all() and keep.sum() == min(len(record), width)


def test_padded_batch_pads_tokens_keeps_other_leaves():
    """Tokens become a dense [batch, longest] tensor with a mask; labels and strings stay."""
    batch = next(iter(_loader()))
    assert sorted(batch) == ["label", "text", "tokens", "tokens_mask"]
    assert isinstance(batch["tokens"], tf.Tensor) and batch["tokens"].dtype == tf.int64
    assert batch["text"].dtype == tf.string and batch["label"].shape == (5,)
    rows = w.unpad(batch["tokens"].numpy(), batch["tokens_mask"].numpy())
    assert [w.record_of(r[0]) for r in rows] == batch["label"].numpy().tolist()
    assert batch["tokens"].shape[1] == max(len(r) for r in rows)


@pytest.mark.parametrize("workers", [{}, {"workers": Workers(2, kind="process")}],
                         ids=["no-workers", "processes"])
def test_padded_batch_epoch_holds_every_record_once(workers):
    """An epoch's batches hold every record once, as batch() holds them, with any workers."""
    with _loader(**workers) as loader:
        labels = [label for b in loader for label in b["label"].numpy().tolist()]
    plain = ResumableLoader.from_pipeline(Pipeline(DATA, seed=5).shuffle().batch(5), num_epochs=1)
    assert labels == [label for b in plain for label in b["label"].numpy().tolist()]


def test_padded_batch_pad_to_gives_static_shape():
    """A fixed pad_to gives every batch that length, in the element spec too."""
    loader = _loader(pad_to=40, drop_remainder=True)
    assert loader.element_spec["tokens"].shape.as_list() == [5, 40]
    assert {tuple(b["tokens"].shape) for b in loader} == {(5, 40)}


def test_padded_batch_record_longer_than_pad_to_raises_naming_it():
    """A record longer than pad_to is a RecordSpecError naming it, unless truncate=True."""
    pipeline = Pipeline(w.tokens([2, 7, 3]), seed=0).padded_batch(3, pad_to=5)
    with pytest.raises(RecordSpecError, match=r"Record index 1 \(epoch 0, position 1\)") as info:
        next(iter(ResumableLoader.from_pipeline(pipeline)))
    assert "longer than pad_to=5" in str(info.value) and "truncate=True" in str(info.value)
    truncated = Pipeline(w.tokens([2, 7, 3]), seed=0).padded_batch(3, pad_to=5, truncate=True)
    assert next(iter(ResumableLoader.from_pipeline(truncated))).numpy()[1].tolist() == [
        2000, 2001, 2002, 2003, 2004
    ]


def test_padded_batch_pad_value_per_key():
    """pad_value as a mapping sets each key's fill value."""
    data = {"a": w.tokens([1, 3]), "b": [np.ones(n, np.float32) for n in (2, 1)]}
    pipeline = Pipeline(data, seed=0).padded_batch(2, pad_value={"a": -1, "b": 0.5})
    batch = next(iter(ResumableLoader.from_pipeline(pipeline)))
    assert batch["a"].numpy().tolist() == [[1000, -1, -1], [2000, 2001, 2002]]
    assert batch["b"].numpy().tolist() == [[1.0, 1.0], [1.0, 0.5]]


def test_padded_batch_nan_pad_value_fills_float_leaves():
    """pad_value=nan pads float leaves with NaN (NaN equals no number, yet float32 holds it)."""
    data = [np.ones(n, np.float32) for n in (1, 3)]
    pipeline = Pipeline(data, seed=0).padded_batch(2, pad_value=float("nan"))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    rows = next(iter(loader)).numpy()
    assert np.isnan(rows[0, 1:]).all() and not np.isnan(rows[1]).any()
    assert loader.get_state()["padded_batch.pad_value"] == "nan"


def test_padded_batch_nan_pad_value_for_int_leaf_raises():
    """NaN for an integer leaf is refused like any value the dtype cannot hold."""
    with pytest.raises(ValueError, match="int64 holds exactly") as info:
        ResumableLoader.from_pipeline(Pipeline(DATA, seed=0).padded_batch(4, pad_value=np.nan))
    assert "pad_value=nan" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pad_value": -1.5}, "int64 holds exactly"),
        ({"pad_value": {"nope": 0}}, r"Received keys \['nope'\]"),
        ({"pad_to": 0}, r"`pad_to` must be an integer in \[1,"),
    ],
    ids=["inexact-pad-value", "unknown-key", "zero-pad-to"],
)
def test_padded_batch_bad_arguments_raise(kwargs, match):
    """Pad values the dtype cannot hold, unknown keys and lengths < 1 are refused."""
    with pytest.raises(ValueError, match=match) as info:
        ResumableLoader.from_pipeline(Pipeline(DATA, seed=0).padded_batch(4, **kwargs))
    assert "Received" in str(info.value)


def test_padded_batch_without_varying_leaf_raises():
    """Records with nothing to pad are refused, with the output_signature hint."""
    with pytest.raises(ValueError, match="no leaf of these records does") as info:
        ResumableLoader.from_pipeline(Pipeline(np.zeros((4, 3)), seed=0).padded_batch(2))
    assert "output_signature" in str(info.value)


def test_padded_batch_mask_of_single_array_record_is_a_tuple():
    """A record that is one array becomes (values, mask)."""
    pipeline = Pipeline(w.tokens([1, 2]), seed=0).padded_batch(2, mask=True)
    values, mask = next(iter(ResumableLoader.from_pipeline(pipeline)))
    assert values.numpy().tolist() == [[1000, 0], [2000, 2001]]
    assert mask.numpy().tolist() == [[True, False], [True, True]]


def test_padded_batch_resumes_with_another_batch_size():
    """The batch size is not an order field: a state continues with another one, exactly."""
    loader = _loader(batch_size=5)
    loader.advance(2)
    other = _loader(batch_size=3)
    other.set_state(loader.get_state())
    labels = [label for b in other for label in b["label"].numpy().tolist()]
    order = loader.plan.indices(0, 0, 23).tolist()
    assert labels == order[10:]


def test_padded_batch_input_pipelines_together_hold_the_single_process_batch():
    """With input_context every step's records across pipelines are the batch's records."""
    loader = _loader(batch_size=4, drop_remainder=True)
    steps = [sorted(b["label"].numpy().tolist()) for b in loader]
    per_pipeline = []
    for pipeline_id in range(2):
        fresh = _loader(batch_size=4, drop_remainder=True)
        ds = fresh.dataset(input_context=tf.distribute.InputContext(2, pipeline_id, 2))
        per_pipeline.append([b["label"].numpy().tolist() for b in ds])
    together = [sorted(a + b) for a, b in zip(*per_pipeline, strict=True)]
    assert together == steps


def test_padded_batch_other_shard_count_continues_without_loss():
    """Like batch(), a padded loader continues with another shard count anywhere, exactly."""
    single = _loader(batch_size=3)
    single.advance(3)  # 9 records: an odd offset, fine for 1 or 3 shards
    state = single.get_state()
    labels = []
    for shard in range(3):
        loader = ResumableLoader.from_pipeline(
            Pipeline(DATA, seed=5).shuffle().padded_batch(2, mask=True), num_epochs=1,
            shard=Shard(shard, 3),
        )
        loader.set_state(state)
        labels += [label for b in loader for label in b["label"].numpy().tolist()]
    order = single.plan.indices(0, 0, 21).tolist()  # 3 shards keep 21 of the 23 records
    assert sorted(labels) == sorted(order[9:21])
