"""ConcatSource, the record space of `Pipeline.mix`: mixtures of real sources (TFRecord,
ArrayRecord, Hugging Face; bytes, strings, ragged lists), with and without a map_fn, and the
mixture's spec from its parts."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader
from resumeloader.sources import ArraySource, ConcatSource, TFRecordSource

array_record_module = pytest.importorskip("array_record.python.array_record_module")
datasets = pytest.importorskip("datasets")

from resumeloader.sources import ArrayRecordSource  # noqa: E402

WEB = [b"web-%d" % i + b"!" * (i % 5) for i in range(23)]
CODE = [b"code-%d" % i * (1 + i % 3) for i in range(9)]
WEB_SOURCE = WEB[0::2] + WEB[1::2]  # the TFRecord source's order: file web-0, then web-1


@pytest.fixture
def files(tmp_path):
    """WEB as two TFRecord files, CODE as one ArrayRecord file."""
    for shard in range(2):
        with tf.io.TFRecordWriter(str(tmp_path / f"web-{shard}.tfrecord")) as writer:
            for record in WEB[shard::2]:
                writer.write(record)
    writer = array_record_module.ArrayRecordWriter(
        str(tmp_path / "code.array_record"), "group_size:1"
    )
    for record in CODE:
        writer.write(record)
    writer.close()
    return tmp_path


def _file_sources(folder) -> dict:
    web = TFRecordSource(
        [folder / "web-0.tfrecord", folder / "web-1.tfrecord"], index_dir=folder / "ix"
    )
    return {"web": web, "code": ArrayRecordSource(str(folder / "code.array_record"))}


def _expected(loader: ResumableLoader, parts: dict, num_batches: int) -> list:
    """The records at the loader's keys, read one by one from the parts."""
    source = loader.pipeline.source
    offsets = np.arange(num_batches * loader.batch_size)
    keys = loader.pipeline.index_stage.indices(0, offsets, seed=loader.pipeline.seed)
    return [parts[name][record] for name, _, record in map(source.locate, keys.tolist())]


def test_mix_tfrecord_and_array_record_bytes_yields_each_record(files):
    """A 70/30 mixture of TFRecord and ArrayRecord bytes: every batch holds the right bytes."""
    pipeline = Pipeline.mix(_file_sources(files), weights={"web": 0.7, "code": 0.3}, seed=1)
    loader = ResumableLoader.from_pipeline(pipeline.batch(6), num_epochs=1)

    batches = [b.numpy().tolist() for b in loader]

    flat = [record for batch in batches for record in batch]
    assert flat == _expected(loader, {"web": WEB_SOURCE, "code": CODE}, len(batches))[: len(flat)]
    assert loader.element_spec == tf.TensorSpec((None,), tf.string)
    assert len(set(flat) & set(CODE)) > 0 and len(set(flat) & set(WEB)) > 0


def _decode(record: bytes, rng: np.random.Generator) -> dict:
    """Bytes to a token array of varying length (ragged), with keyed noise."""
    tokens = np.frombuffer(record, dtype=np.uint8).astype(np.int64)
    return {"raw": record, "tokens": tokens + rng.integers(0, 2, size=len(tokens))}


def test_mix_tfrecord_and_array_record_with_map_fn_decodes_each_record(files):
    """With a map_fn, each mixed record is decoded; the ragged spec is declared."""
    pipeline = Pipeline.mix(_file_sources(files), weights={"web": 1, "code": 1}, seed=2)
    signature = {"raw": tf.TensorSpec((), tf.string), "tokens": tf.TensorSpec((None,), tf.int64)}
    pipeline = pipeline.map(_decode, output_signature=signature).batch(5)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)

    batches = list(loader)

    raws = [r for b in batches for r in b["raw"].numpy().tolist()]
    assert raws == _expected(loader, {"web": WEB_SOURCE, "code": CODE}, len(batches))[: len(raws)]
    tokens = [t for b in batches for t in b["tokens"].to_list()]
    assert [len(t) for t in tokens] == [len(r) for r in raws]


def _hf(texts: list[str], tokens: list[list[int]]):
    return datasets.Dataset.from_dict({"text": texts, "tokens": tokens})


def test_mix_hugging_face_strings_and_token_lists_batches_ragged():
    """Two HF datasets of text and token lists mix into string and ragged batches."""
    a = _hf([f"a{i}" for i in range(13)], [list(range(i % 4)) for i in range(13)])
    b = _hf([f"b{i}" * 3 for i in range(7)], [[100 + i] * (1 + i % 2) for i in range(7)])
    pipeline = Pipeline.mix({"a": a, "b": b}, weights={"a": 2, "b": 1}, seed=3).batch(4)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)

    batches = list(loader)

    assert loader.element_spec["tokens"] == tf.RaggedTensorSpec((None, None), tf.int64, 1)
    rows = [a[i] for i in range(13)], [b[i] for i in range(7)]
    want = _expected(loader, {"a": rows[0], "b": rows[1]}, len(batches))
    got = [
        (text.decode(), tokens)
        for batch in batches
        for text, tokens in zip(
            batch["text"].numpy().tolist(), batch["tokens"].to_list(), strict=True
        )
    ]
    assert got == [(row["text"], row["tokens"]) for row in want][: len(got)]


def test_mix_token_lists_spec_is_ragged_without_output_signature():
    """A mixture of token lists infers a ragged leaf (as one list does), no signature needed."""
    short = [np.arange(1 + i % 3) for i in range(10)]
    long = [np.arange(5 + i % 4) + 50 for i in range(6)]
    pipeline = Pipeline.mix({"s": short, "l": long}, weights={"s": 1, "l": 1}, seed=4)
    loader = ResumableLoader.from_pipeline(pipeline.batch(4), num_epochs=1)

    rows = [row for batch in loader for row in batch.to_list()]

    assert loader.element_spec == tf.RaggedTensorSpec((None, None), tf.int64, 1)
    want = _expected(loader, {"s": short, "l": long}, 3)
    assert rows == [w.tolist() for w in want][: len(rows)]


def test_concat_source_spec_varies_where_any_part_varies():
    """The mixture's spec: a dimension fixed in every part stays fixed, else it varies."""
    fixed = ArraySource({"x": np.zeros((4, 3)), "t": [np.zeros(2), np.zeros(5)] * 2})
    other = ArraySource({"x": np.ones((2, 3)), "t": np.ones((2, 2))})

    spec = ConcatSource({"f": fixed, "o": other}).record_spec()

    assert spec is not None
    assert spec.describe() == "{x: float64[3], t: float64[None]}"
