"""The loader's options as values: Workers, Shard and the record spec where the stream is
defined; the keywords of 0.2 (never released) are refused, naming their spelling now."""

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


def test_from_pipeline_takes_shard_and_workers_values():
    """`Shard` and `Workers` values define the shard read and the workers that make it."""
    loader = ResumableLoader.from_pipeline(
        _pipeline(), num_epochs=2, shard=Shard(1, 2), workers=Workers(2, kind="process")
    )
    reference = ResumableLoader.from_pipeline(_pipeline(), num_epochs=2, shard=Shard(1, 2))
    with loader:
        assert _drain(loader) == _drain(reference)
    assert (loader.workers, loader.shard) == (Workers(2, kind="process"), Shard(1, 2))
    default = ResumableLoader.from_pipeline(_pipeline())
    assert (reference.workers, default.workers, default.shard) == (Workers(), Workers(), Shard())


_REMOVED = [
    ({"shard_index": 1}, "`shard_index`", "shard=Shard(index, count)"),
    ({"shard_count": 2}, "`shard_count`", "shard=Shard(index, count)"),
    ({"num_workers": 2}, "`num_workers`", "workers=Workers(num_workers, kind=..., timeout=...)"),
    ({"worker_type": "process"}, "`worker_type`", "workers=Workers("),
    ({"worker_timeout": 5.0}, "`worker_timeout`", "workers=Workers("),
    ({"shard_index": 1, "shard_count": 2}, "`shard_index`, `shard_count`",
     "shard=Shard(index, count). Received: shard_index=1, shard_count=2."),
]
_REMOVED_IDS = ["shard_index", "shard_count", "num_workers", "worker_type", "worker_timeout",
                "shard-both"]


@pytest.mark.parametrize(("keywords", "names", "instead"), _REMOVED, ids=_REMOVED_IDS)
def test_loader_keyword_of_0_2_raises_type_error_naming_the_new_spelling(
    keywords, names, instead
):
    """The keywords of 0.2 (never released) are gone: each names its spelling now."""
    with pytest.raises(TypeError) as info:
        ResumableLoader(_DATA, batch_size=4, seed=0, **keywords)
    assert f"ResumableLoader() takes no {names} any more: use " in str(info.value)
    assert instead in str(info.value)


@pytest.mark.parametrize(
    ("keywords", "instead"),
    [({"shard_count": 2}, "shard=Shard(index, count)"),
     ({"num_workers": 2}, "workers=Workers("),
     ({"output_signature": tf.TensorSpec((3,), tf.float32)}, ".map(fn, output_signature=...)")],
    ids=["shard", "workers", "output_signature"],
)
def test_from_pipeline_keyword_of_0_2_raises_type_error_naming_the_new_spelling(
    keywords, instead
):
    """`from_pipeline` refuses them too, `output_signature` among them."""
    with pytest.raises(TypeError, match=r"from_pipeline\(\) takes no") as info:
        ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, **keywords)
    assert instead in str(info.value)


def test_from_pipeline_unknown_keyword_raises_type_error():
    """A misspelt keyword is refused as Python would refuse it."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
        ResumableLoader.from_pipeline(_pipeline(), num_worker=2)


@pytest.mark.parametrize(
    ("keywords", "named"),
    [({"workers": 2}, "`workers` must be a resumeloader.Workers"),
     ({"shard": (0, 2)}, "`shard` must be a resumeloader.Shard")],
    ids=["workers-int", "shard-tuple"],
)
def test_loader_option_of_the_wrong_type_raises(keywords, named):
    """A value that is not the option's type is refused, naming it."""
    with pytest.raises(TypeError, match=named) as info:
        ResumableLoader(_DATA, batch_size=4, seed=0, **keywords)
    assert "Received:" in str(info.value)


def test_short_constructor_takes_the_values():
    """`ResumableLoader(source, ...)` takes `workers` and `shard` as `from_pipeline` does."""
    options = dict(batch_size=4, seed=3, num_epochs=2, map_fn=fns.augment)
    short = ResumableLoader(_DATA, shard=Shard(1, 2), workers=Workers(2), **options)
    pipeline = Pipeline(_DATA, seed=3).shuffle().map(fns.augment).batch(4)
    long = ResumableLoader.from_pipeline(pipeline, num_epochs=2, shard=Shard(1, 2))
    with short:
        assert _drain(short) == _drain(long)
    assert short.workers == Workers(2, kind="thread")


def test_output_signature_given_where_the_stream_is_defined():
    """The spec given to Pipeline (no record stage) or to map describes the records."""
    spec = tf.TensorSpec((None,), tf.int64)
    plain = Pipeline(_TOKENS, seed=0, output_signature=spec).batch(4)
    mapped = Pipeline(_TOKENS, seed=0).map(fns.augment, output_signature=spec).batch(4)
    described = Pipeline(_TOKENS, seed=0).map(fns.augment).with_output_signature(spec).batch(4)
    for pipeline in (plain, mapped, described):
        loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
        assert isinstance(next(iter(loader)), tf.RaggedTensor)
    assert described.record_spec == mapped.record_spec


def test_record_stage_after_the_spec_resets_it():
    """A map after Pipeline(output_signature=...) changes the records: its spec is its own."""
    pipeline = Pipeline(_TOKENS, seed=0, output_signature=tf.TensorSpec((None,), tf.int64))
    assert pipeline.record_spec is not None
    assert pipeline.map(fns.augment).record_spec is None


def test_output_signature_not_of_tensor_specs_raises_naming_it():
    """A signature that is not a structure of tf.TensorSpec is refused by the pipeline."""
    with pytest.raises(TypeError, match=r"must be a structure of tf\.TensorSpec"):
        Pipeline(_TOKENS, seed=0, output_signature=(None,))
