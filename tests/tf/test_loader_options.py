"""The loader's options as values: Workers, Shard and the record spec where the stream is
defined; the keywords of 0.2 keep working (on from_pipeline with a DeprecationWarning)."""

from __future__ import annotations

import _worker_fns as fns
import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader, Shard, Workers

_DATA = np.arange(23 * 3, dtype=np.float32).reshape(23, 3)
_TOKENS = [np.arange(i % 5, dtype=np.int64) + i for i in range(23)]


def _drain(loader: ResumableLoader) -> list[bytes]:
    return [batch.numpy().tobytes() for batch in loader]


def _pipeline() -> Pipeline:
    return Pipeline(_DATA, seed=3).shuffle().map(fns.augment).batch(4)


def test_from_pipeline_new_form_streams_as_the_keywords_of_0_2():
    """Shard and Workers values give the stream the 0.2 keywords gave, without a warning."""
    with pytest.warns(DeprecationWarning):
        old = ResumableLoader.from_pipeline(
            _pipeline(), num_epochs=2, shard_index=1, shard_count=2, num_workers=2,
            worker_type="process",
        )
    new = ResumableLoader.from_pipeline(
        _pipeline(), num_epochs=2, shard=Shard(1, 2), workers=Workers(2, kind="process")
    )
    with old, new:
        assert _drain(new) == _drain(old)
    assert (new.workers, new.shard) == (Workers(2, kind="process"), Shard(1, 2))
    assert (new.num_workers, new.worker_type) == (2, "process")


@pytest.mark.parametrize(
    ("keywords", "named"),
    [({"shard_index": 1, "shard_count": 2}, "shard=Shard(index, count)"),
     ({"num_workers": 2}, "workers=Workers(num_workers, kind=..., timeout=...)"),
     ({"output_signature": tf.TensorSpec((3,), tf.float32)}, "output_signature=...)")],
    ids=["shard", "workers", "output_signature"],
)
def test_from_pipeline_keyword_of_0_2_warns_naming_the_new_form(keywords, named):
    """Each deprecated keyword still works and its warning names what replaces it."""
    with pytest.warns(DeprecationWarning, match="from_pipeline") as caught:
        loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, **keywords)
    assert named in str(caught[0].message)
    assert len(_drain(loader)) > 0


def test_from_pipeline_unknown_keyword_raises_type_error():
    """A misspelt keyword is refused as Python would refuse it."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
        ResumableLoader.from_pipeline(_pipeline(), num_worker=2)


@pytest.mark.parametrize(
    "keywords",
    [{"workers": Workers(2), "num_workers": 2}, {"shard": Shard(0, 2), "shard_count": 2},
     {"workers": 2}, {"shard": (0, 2)}],
    ids=["workers-twice", "shard-twice", "workers-int", "shard-tuple"],
)
def test_loader_option_given_twice_or_of_the_wrong_type_raises(keywords):
    """A value and its 0.2 keywords together, or a value that is not one, is refused."""
    with pytest.raises(TypeError) as info:
        ResumableLoader(_DATA, batch_size=4, seed=0, **keywords)
    assert "Received:" in str(info.value)


def test_short_constructor_takes_the_values_too():
    """`ResumableLoader(source, ...)` takes `workers` and `shard` beside its 0.2 keywords."""
    options = dict(batch_size=4, seed=3, num_epochs=2, map_fn=fns.augment)
    old = ResumableLoader(_DATA, shard_index=1, shard_count=2, num_workers=2, **options)
    new = ResumableLoader(_DATA, shard=Shard(1, 2), workers=Workers(2), **options)
    assert _drain(new) == _drain(old)
    assert new.workers == old.workers == Workers(2, kind="thread")


def test_output_signature_given_where_the_stream_is_defined():
    """The spec given to Pipeline (no record stage) or to map describes the records."""
    spec = tf.TensorSpec((None,), tf.int64)
    plain = Pipeline(_TOKENS, seed=0, output_signature=spec).batch(4)
    mapped = Pipeline(_TOKENS, seed=0).map(fns.augment, output_signature=spec).batch(4)
    for pipeline in (plain, mapped):
        loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
        assert isinstance(next(iter(loader)), tf.RaggedTensor)
    with pytest.warns(DeprecationWarning):
        old = ResumableLoader.from_pipeline(
            Pipeline(_TOKENS, seed=0).map(fns.augment).batch(4), num_epochs=1,
            output_signature=spec,
        )
    assert old.element_spec == ResumableLoader.from_pipeline(mapped, num_epochs=1).element_spec


def test_record_stage_after_the_spec_resets_it():
    """A map after Pipeline(output_signature=...) changes the records: its spec is its own."""
    pipeline = Pipeline(_TOKENS, seed=0, output_signature=tf.TensorSpec((None,), tf.int64))
    assert pipeline.record_spec is not None
    assert pipeline.map(fns.augment).record_spec is None


def test_output_signature_not_of_tensor_specs_raises_naming_it():
    """A signature that is not a structure of tf.TensorSpec is refused by the pipeline."""
    with pytest.raises(TypeError, match=r"must be a structure of tf\.TensorSpec"):
        Pipeline(_TOKENS, seed=0, output_signature=(None,))
