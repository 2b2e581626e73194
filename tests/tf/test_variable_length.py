"""Variable-length records: bytes and str become tf.string batches, arrays of varying shape
become tf.RaggedTensor batches, in every delivery path, with every kind of worker."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader
from resumeloader import RecordSpecError, ResumableLoader, testing
from resumeloader.core import spec as spec_lib
from resumeloader.core import wire

pytestmark = pytest.mark.usefixtures("clean_keras")

WORDS = ["a", "bb", "ccc", "", "d\u00e9j\u00e0", "ff", "g"]
# Serialized records end in NUL bytes more often than one would think.
BLOBS = [b"\x00", b"x\x00\x00", b"", b"\xff" * 300, b"abc", b"\x00y"]
TOKENS = [np.arange(n, dtype=np.int64) * 10 + n for n in (3, 1, 4, 0, 5, 2, 6)]

WORKERS = [
    pytest.param({}, id="no-workers"),
    pytest.param({"workers": resumeloader.Workers(2, kind="thread")}, id="threads"),
    pytest.param({"workers": resumeloader.Workers(2, kind="process")}, id="processes"),
]
WAYS = ["for-loop", "dataset"]


def _batches(loader: ResumableLoader, way: str) -> list:
    return list(loader) if way == "for-loop" else list(loader.dataset())


def _order(num_records: int, seed: int) -> list[int]:
    sampler = resumeloader.IndexSampler(num_records, seed=seed)
    return sampler.epoch_indices(0, 0, num_records).tolist()


def _ragged_lists(batches) -> list[list[int]]:
    return [row for batch in batches for row in batch.to_list()]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("way", WAYS)
def test_loader_str_records_yield_utf8_string_batches(way, workers):
    """A list of str is a source of tf.string records (UTF-8 bytes), in the shuffled order."""
    loader = ResumableLoader(WORDS, batch_size=3, seed=4, num_epochs=1, **workers)

    batches = _batches(loader, way)

    assert all(b.dtype == tf.string for b in batches)
    got = [s for b in batches for s in b.numpy().tolist()]
    assert got == [WORDS[i].encode() for i in _order(len(WORDS), 4)]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("way", WAYS)
def test_loader_bytes_records_keep_every_byte(way, workers):
    """Bytes records arrive byte for byte, NUL bytes at either end included."""
    loader = ResumableLoader(BLOBS, batch_size=4, seed=0, shuffle=False, num_epochs=1, **workers)

    got = [s for b in _batches(loader, way) for s in b.numpy().tolist()]

    assert got == BLOBS


@pytest.mark.parametrize(
    "column",
    [
        np.array(WORDS, dtype=object),
        np.array([w.encode() for w in WORDS], dtype=object),
        np.array(WORDS),
    ],
    ids=["object-str", "object-bytes", "unicode-array"],
)
def test_loader_string_array_column_yields_string_batches(column):
    """Object arrays of str or bytes, and NumPy unicode arrays, are string columns."""
    loader = ResumableLoader({"word": column}, batch_size=7, seed=0, shuffle=False)

    batch = next(iter(loader))

    assert batch["word"].numpy().tolist() == [w.encode() for w in WORDS]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("way", WAYS)
def test_loader_arrays_of_varying_length_yield_ragged_batches(way, workers):
    """A list of arrays of different lengths is inferred ragged: tf.RaggedTensor batches."""
    loader = ResumableLoader(TOKENS, batch_size=3, seed=5, num_epochs=1, **workers)

    batches = _batches(loader, way)

    assert all(isinstance(b, tf.RaggedTensor) and b.dtype == tf.int64 for b in batches)
    assert _ragged_lists(batches) == [TOKENS[i].tolist() for i in _order(len(TOKENS), 5)]


@pytest.mark.parametrize("workers", WORKERS)
def test_loader_map_fn_with_output_signature_yields_ragged_batches(workers):
    """A map_fn returning arrays of varying length works with a None dimension in the signature."""
    loader = ResumableLoader(
        np.arange(9),
        batch_size=4,
        seed=1,
        num_epochs=1,
        shuffle=False,
        map_fn=_repeat_record,
        output_signature={
            "tokens": tf.TensorSpec((None,), tf.int32),
            "n": tf.TensorSpec((), tf.int64),
        },
        **workers,
    )

    batches = list(loader.dataset())

    assert [row for b in batches for row in b["tokens"].to_list()] == [[i] * i for i in range(9)]
    assert [n for b in batches for n in b["n"].numpy().tolist()] == list(range(9))


def _repeat_record(record, rng):
    return {"tokens": np.full(int(record), record, np.int32), "n": record}


def test_loader_ragged_dimension_after_a_fixed_one_keeps_it_uniform():
    """Record shape (2, None): a batch is ragged [batch, 2, None] with the 2 kept static."""
    records = [np.arange(2 * n, dtype=np.float32).reshape(2, n) for n in (1, 3, 0)]
    loader = ResumableLoader(records, batch_size=3, seed=0, shuffle=False, num_epochs=1)

    (batch,) = list(loader.dataset())

    assert batch.shape.as_list() == [3, 2, None]
    assert batch.to_list() == [r.tolist() for r in records]


def test_loader_variable_images_become_ragged_with_fixed_channels():
    """Images of different heights and widths: ragged [batch, None, None, 3]."""
    images = [np.full((h, w, 3), h * 10 + w, np.uint8) for h, w in ((2, 3), (1, 1), (4, 2))]
    loader = ResumableLoader(images, batch_size=3, seed=0, shuffle=False, num_epochs=1)

    (batch,) = list(loader)

    assert batch.shape.as_list() == [3, None, None, 3]
    assert [np.array(x).tolist() for x in batch.to_list()] == [i.tolist() for i in images]


def test_loader_drop_remainder_ragged_batches_have_static_batch_size():
    """With drop_remainder the ragged element spec and the batches carry the batch size."""
    loader = ResumableLoader(TOKENS, batch_size=3, seed=0, drop_remainder=True, num_epochs=1)

    batches = list(loader.dataset())

    assert loader.element_spec.shape.as_list() == [3, None]
    assert loader.dataset().element_spec == loader.element_spec
    assert [b.shape[0] for b in batches] == [3, 3]


def test_loader_strings_and_ragged_in_one_dict_with_metadata():
    """A dict of a string column, a ragged column and a label, with metadata, both ways."""
    data = {"text": WORDS, "tokens": TOKENS, "label": np.arange(7)}
    make = lambda: ResumableLoader(data, batch_size=3, seed=2, num_epochs=1, with_metadata=True)  # noqa: E731

    (loop, meta), *_ = list(make())
    (graph, _), *_ = list(make().dataset())

    index = meta["index"].numpy().tolist()
    for batch in (loop, graph):
        assert batch["text"].numpy().tolist() == [WORDS[i].encode() for i in index]
        assert batch["tokens"].to_list() == [TOKENS[i].tolist() for i in index]
        assert batch["label"].numpy().tolist() == index


def test_loader_string_records_resume_identically():
    """String records restore exactly (their bytes compared, not object pointers)."""
    testing.assert_resumes_identically(
        lambda: ResumableLoader(WORDS * 3, batch_size=4, seed=3, num_epochs=2), num_steps=7
    )


# -- specs and errors -------------------------------------------------------------------


def test_loader_record_of_other_dtype_raises_spec_error_naming_leaf_in_words():
    """A record that does not fit names its index, the leaf path, expected and received."""
    records = [{"text": "a", "n": 1}, {"text": "b", "n": 2}, {"text": 3.5, "n": 3}]
    loader = ResumableLoader(records, batch_size=3, seed=0, shuffle=False)

    with pytest.raises(RecordSpecError) as info:
        next(iter(loader))

    message = str(info.value)
    assert info.value.record_index == 2
    assert "Record index 2 (epoch 0, position 2)" in message
    assert "record['text'] is float64[], expected string[]" in message
    assert "bytes8" not in message and "str32" not in message


def test_loader_fixed_spec_then_longer_record_raises_with_none_advice():
    """Inferred from record 0 through a map_fn, a longer record says how to allow it."""
    loader = ResumableLoader(
        np.arange(1, 5),
        batch_size=4,
        seed=0,
        shuffle=False,
        map_fn=lambda record, rng: np.zeros(int(record), np.float32),
    )

    with pytest.raises(RecordSpecError) as info:
        next(iter(loader))

    assert "record is float32[2], expected float32[1]" in str(info.value)
    assert "None" in str(info.value) and "output_signature" in str(info.value)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(np.arange(12, dtype=np.float32).reshape(4, 3), id="read_batch-path"),
        pytest.param([np.arange(3, dtype=np.float32)] * 4, id="records-path"),
    ],
)
def test_loader_output_signature_with_batch_dimension_says_it_must_not(source):
    """A signature that includes the batch dimension gets a message saying it must not."""
    loader = ResumableLoader(
        source, batch_size=4, seed=0, output_signature=tf.TensorSpec((4, 3), tf.float32)
    )

    with pytest.raises(RecordSpecError) as info:
        next(iter(loader))

    assert "without the batch dimension" in str(info.value)
    assert "(3,)" in str(info.value)


def test_loader_read_batch_with_ragged_leaf_of_other_dtype_raises_spec_error():
    """A batched source returning a ragged leaf of the wrong dtype is caught per batch."""

    class Ragged:
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return np.arange(index, dtype=np.int64)

        def read_batch(self, indices):
            return [np.arange(i, dtype=np.float64) for i in indices]

    loader = ResumableLoader(
        Ragged(), batch_size=2, seed=0, output_signature=tf.TensorSpec((None,), tf.int64)
    )

    with pytest.raises(RecordSpecError) as info:
        next(iter(loader))

    assert "a record's value is float64[" in str(info.value)
    assert "expected int64[None]" in str(info.value)


def test_loader_string_signature_accepts_str_and_bytes():
    """output_signature tf.string takes str and bytes records alike."""
    loader = ResumableLoader(
        ["x", b"y"],
        batch_size=2,
        seed=0,
        shuffle=False,
        output_signature=tf.TensorSpec((), tf.string),
    )

    assert next(iter(loader)).numpy().tolist() == [b"x", b"y"]


def test_loader_ragged_tensor_spec_signature_is_accepted():
    """A tf.RaggedTensorSpec per record means a None dimension."""
    loader = ResumableLoader(
        TOKENS,
        batch_size=7,
        seed=0,
        shuffle=False,
        output_signature=tf.RaggedTensorSpec((None,), tf.int64, ragged_rank=0),
    )

    assert next(iter(loader)).to_list() == [t.tolist() for t in TOKENS]


# -- distributed input ---------------------------------------------------------------


@pytest.mark.parametrize("replicas", [2, 4], ids=["2-replicas", "4-replicas"])
def test_dataset_input_context_splits_strings_and_ragged_per_replica(replicas):
    """Each pipeline batch is cut into per-replica batches, strings and ragged leaves intact."""
    data = {"text": WORDS * 4, "tokens": TOKENS * 4}
    make = lambda: ResumableLoader(data, batch_size=8, seed=6, num_epochs=1, drop_remainder=True)  # noqa: E731
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
    )

    split = list(make().dataset(input_context=context))
    whole = list(make().dataset())

    assert len(split) == len(whole) * replicas
    for step, batch in enumerate(whole):
        parts = split[step * replicas : (step + 1) * replicas]
        assert [t for p in parts for t in p["text"].numpy().tolist()] == batch[
            "text"
        ].numpy().tolist()
        assert [t for p in parts for t in p["tokens"].to_list()] == batch["tokens"].to_list()
        assert all(p["tokens"].shape[0] == 8 // replicas for p in parts)


def test_dataset_mirrored_strategy_runs_ragged_batches():
    """Under MirroredStrategy each replica gets its share of a ragged batch."""
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        loader = ResumableLoader(
            TOKENS * 2, batch_size=4, seed=0, drop_remainder=True, num_epochs=1
        )
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: loader.dataset(input_context=ctx)
    )

    rows = []
    for batch in dataset:
        for part in strategy.experimental_local_results(batch):
            rows += part.to_list()
        loader.advance()

    records = TOKENS * 2
    expected = [tuple(records[i].tolist()) for i in _order(len(records), 0)[:12]]
    assert sorted(map(tuple, rows)) == sorted(expected)
    assert loader.exhausted


# -- the wire format ------------------------------------------------------------------

_DIMS = st.lists(st.sampled_from([None, 0, 1, 2]), min_size=0, max_size=3)


@settings(max_examples=100, deadline=None)
@given(dims=_DIMS, data=st.data(), strings=st.booleans())
def test_wire_decode_of_encode_returns_every_record(dims, data, strings):
    """decode(encode(column)) gives back every record's values, for any shape pattern."""
    leaf = spec_lib.LeafSpec(tuple(dims), spec_lib.STRING if strings else np.dtype(np.int16))
    shapes = data.draw(
        st.lists(
            st.tuples(*[st.integers(0, 3) if d is None else st.just(d) for d in dims]),
            max_size=5,
        )
    )
    column = [_values(shape, i, strings) for i, shape in enumerate(shapes)]

    decoded = wire.decode(wire.encode(column, leaf), leaf)

    if not leaf.ragged:
        assert decoded.shape == (len(column), *dims)
        assert [np.asarray(d).tolist() for d in decoded] == [c.tolist() for c in column]
    else:
        values, parts = decoded
        assert values.ravel().tolist() == [v for c in column for v in c.ravel().tolist()]
        assert len(parts) == 1 + max(i for i, d in enumerate(dims) if d is None)


def _values(shape: tuple[int, ...], i: int, strings: bool) -> np.ndarray:
    size = int(np.prod(shape))
    if strings:
        items = np.array([f"{i}" * (k % 3) for k in range(size)], dtype=object)
        return spec_lib.leaf_array(items.reshape(shape))
    return np.arange(size, dtype=np.int16).reshape(shape) + i
