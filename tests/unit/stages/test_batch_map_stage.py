"""The batch map stage as a value, and the per-row generators it hands out. No TensorFlow."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from resumeloader import Pipeline
from resumeloader.core import rng
from resumeloader.stages import BatchMapStage, MapBatchStage


def _identity(batch, rngs):
    return batch


@pytest.mark.parametrize(
    ("make", "build"),
    [
        (lambda: MapBatchStage(3), lambda p: p.map_batch(3)),
        (lambda: MapBatchStage(_identity, rowwise="no"),
         lambda p: p.map_batch(_identity, rowwise="no")),
        (lambda: MapBatchStage(_identity, out=1), lambda p: p.map_batch(_identity, out=1)),
    ],
    ids=["not-callable", "rowwise-str", "out-int"],
)
def test_map_batch_stage_refuses_what_its_builder_refuses(make, build):
    with pytest.raises((TypeError, ValueError)) as direct:
        make()
    with pytest.raises((TypeError, ValueError)) as built:
        build(Pipeline(np.arange(10), seed=0).batch(2))
    assert str(direct.value) == str(built.value)
    assert "Received:" in str(direct.value)


def test_rowwise_stage_has_no_order_field_and_ignores_the_batch_size():
    stage = MapBatchStage(_identity)
    assert isinstance(stage, BatchMapStage) and stage.rowwise
    assert stage.order_fields() == {}
    assert stage.resized(7) is stage


def test_not_rowwise_stage_records_its_batch_size_as_an_order_field():
    pipeline = Pipeline(np.arange(10), seed=0).batch(4).map_batch(_identity, rowwise=False)
    (stage,) = pipeline.batch_map_stages
    assert stage.order_fields() == {"batch_size": 4}
    assert pipeline.order_fields()["map_batch.batch_size"] == 4
    resized = pipeline.with_batch_size(6)
    assert resized.order_fields()["map_batch.batch_size"] == 6


def test_not_rowwise_stage_without_a_batch_size_is_refused():
    with pytest.raises(ValueError, match="rowwise=False, batch_size=None"):
        MapBatchStage(_identity, rowwise=False)


def test_map_batch_stage_pickles_and_compares_by_value():
    stage = MapBatchStage(_identity, rowwise=False, batch_size=3)
    assert pickle.loads(pickle.dumps(stage)) == stage


def test_record_rngs_row_is_the_records_own_generator():
    """Row i's generator is keyed by (seed ^ BATCH_STREAM, epoch, indices[i]) alone."""
    rngs = rng.RecordRngs(5, 2, np.array([11, 3, 11]))
    alone = rng.record_rng(5 ^ rng.BATCH_STREAM, 2, 3).random(4)
    np.testing.assert_array_equal(rngs[1].random(4), alone)
    again = rng.RecordRngs(5, 2, np.array([3])).random((4,))[0]
    np.testing.assert_array_equal(again, alone)


def test_record_rngs_helpers_draw_one_row_each():
    rngs = rng.RecordRngs(0, 0, np.arange(6))
    assert rngs.random().shape == (6,)
    assert rngs.uniform(-1, 1, shape=(2, 3)).shape == (6, 2, 3)
    assert rngs.normal(shape=(4,)).shape == (6, 4)
    values = rngs.integers(0, 5, shape=(3,))
    assert values.dtype == np.int64 and values.min() >= 0 and values.max() < 5
    assert len(rngs) == 6 and len(rngs[1:4]) == 3


def test_record_rngs_stream_is_not_the_map_fns():
    """A map_fn's rng and map_batch's row generator for one record are independent."""
    mapped = rng.record_rng(9, 0, 4).random(8)
    batched = rng.RecordRngs(9, 0, np.array([4]))[0].random(8)
    assert not np.array_equal(mapped, batched)


def _into(batch, rngs, out):
    np.add(batch, rngs.integers(0, 5), out=out)
    return out


def test_out_stage_calls_fn_with_the_out_batch_and_says_so():
    stage = MapBatchStage(_into, out=True)
    out = np.empty(3, np.int64)
    result = stage.apply_batch(np.arange(3), seed=1, epoch=0, indices=np.arange(3), out=out)
    assert result is out
    plain = MapBatchStage(lambda b, r: b + r.integers(0, 5))
    np.testing.assert_array_equal(
        out, plain.apply_batch(np.arange(3), seed=1, epoch=0, indices=np.arange(3)))
    assert stage.describe() == "map_batch(_into(batch, rngs, out))"
    assert stage.order_fields() == {}  # how the output is written is not the stream's
