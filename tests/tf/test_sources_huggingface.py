"""HuggingFaceSource: a datasets.Dataset read a batch at a time as NumPy columns in the
features' dtypes (skipped only when the optional `datasets` extra is missing)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

datasets = pytest.importorskip("datasets")

from resumeloader import (  # noqa: E402
    Pipeline,
    RecordError,
    ResumableLoader,
    StateMismatchError,
)
from resumeloader.sources import HuggingFaceSource, MissingValueError, adapt  # noqa: E402

pytestmark = pytest.mark.usefixtures("clean_keras")

NUM = 11


def _dataset():
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("int32")),
            "embedding": datasets.Sequence(datasets.Value("float32"), length=4),
            "pixels": datasets.Array2D((2, 3), "uint8"),
            "label": datasets.ClassLabel(names=["a", "b", "c"]),
            "meta": {"id": datasets.Value("int64"), "source": datasets.Value("string")},
        }
    )
    data = {
        "text": [f"row {i}" for i in range(NUM)],
        "tokens": [list(range(i % 4)) for i in range(NUM)],
        "embedding": [[i / 2] * 4 for i in range(NUM)],
        "pixels": [np.full((2, 3), i, np.uint8) for i in range(NUM)],
        "label": [i % 3 for i in range(NUM)],
        "meta": [{"id": 100 + i, "source": "web"} for i in range(NUM)],
    }
    return datasets.Dataset.from_dict(data, features=features)


def test_adapt_hugging_face_dataset_reads_through_hugging_face_source():
    """A datasets.Dataset is recognised and read by HuggingFaceSource."""
    assert isinstance(adapt(_dataset()), HuggingFaceSource)


def test_hugging_face_source_spec_follows_features():
    """Fixed-length lists are one leaf of their dtype, open lists ragged, uint8 stays uint8."""
    loader = ResumableLoader(_dataset(), batch_size=4, seed=0)

    spec = loader.element_spec
    assert spec["embedding"] == tf.TensorSpec((None, 4), tf.float32)
    assert spec["pixels"] == tf.TensorSpec((None, 2, 3), tf.uint8)
    assert spec["tokens"] == tf.RaggedTensorSpec((None, None), tf.int32, 1, tf.int64)
    assert spec["text"] == tf.TensorSpec((None,), tf.string)
    assert spec["meta"]["id"] == tf.TensorSpec((None,), tf.int64)


@pytest.mark.parametrize("way", ["for-loop", "dataset"])
def test_loader_over_hugging_face_yields_rows_shuffled(way):
    """Each batch holds the rows of the shuffled order, every column intact."""
    loader = ResumableLoader(_dataset(), batch_size=4, seed=3, num_epochs=1)

    batches = list(loader) if way == "for-loop" else list(loader.dataset())

    order = loader.sampler.epoch_indices(0, 0, NUM).tolist()
    ids = [i for b in batches for i in b["meta"]["id"].numpy().tolist()]
    assert ids == [100 + i for i in order]
    tokens = [t for b in batches for t in b["tokens"].to_list()]
    assert tokens == [list(range(i % 4)) for i in order]
    pixels = np.concatenate([b["pixels"].numpy() for b in batches])
    assert pixels[:, 0, 0].tolist() == order


def test_hugging_face_source_reads_one_batch_per_call():
    """read_batch is one call per batch returning NumPy columns, not lists of scalars."""
    batch = HuggingFaceSource(_dataset()).read_batch(np.array([3, 1]))

    assert isinstance(batch["embedding"], np.ndarray)
    assert batch["embedding"].shape == (2, 4)
    assert batch["label"].dtype == np.int64
    assert batch["label"].tolist() == [0, 1]


def test_loader_hugging_face_with_map_fn_reads_records():
    """With a map_fn, records are read a batch at a time and handed over as dicts."""
    loader = ResumableLoader(
        _dataset(),
        batch_size=NUM,
        seed=0,
        shuffle=False,
        map_fn=lambda record, rng: record["embedding"].sum() + record["meta"]["id"],
    )

    batch = next(iter(loader))

    assert batch.numpy().tolist() == [i * 2 + 100 + i for i in range(NUM)]


def test_hugging_face_decoding_image_feature_refused_with_advice():
    """An Image feature that decodes in Python is refused with the cast that avoids it."""
    ds = datasets.Dataset.from_dict({"image": ["a.png"]}).cast_column("image", datasets.Image())

    with pytest.raises(TypeError) as info:
        HuggingFaceSource(ds)

    assert "Image(decode=False)" in str(info.value)


def test_hugging_face_undecoded_image_is_bytes_and_path():
    """An undecoded Image column is a dict of the encoded bytes and the path."""
    png = tf.io.encode_png(np.zeros((2, 2, 3), np.uint8)).numpy()
    ds = datasets.Dataset.from_dict({"image": [{"bytes": png, "path": "x.png"}]})
    ds = ds.cast_column("image", datasets.Image(decode=False))

    batch = next(iter(ResumableLoader(ds, batch_size=1, seed=0)))

    assert batch["image"]["bytes"].numpy().tolist() == [png]
    assert batch["image"]["path"].numpy().tolist() == [b"x.png"]


def test_hugging_face_images_stored_as_bytes_read_as_bytes():
    """Images stored as bytes (path None, as `datasets` keeps in-memory images) read as
    their bytes with path "", decoded in tf_map; the state is the one of any dataset (no
    fill value recorded), and a restore resumes at the same image."""
    pngs = [tf.io.encode_png(np.full((2, 2, 3), i, np.uint8)).numpy() for i in range(6)]
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": png, "path": None} for png in pngs], "label": list(range(6))},
        features=datasets.Features(
            {"image": datasets.Image(decode=False), "label": datasets.Value("int64")}
        ),
    )
    assert ds.with_format("arrow")[0:1].column("image").to_pylist()[0]["path"] is None

    def pipeline():
        return (
            Pipeline(ds, seed=0)
            .batch(2)
            .tf_map(
                lambda b, seed: tf.map_fn(
                    lambda x: tf.io.decode_png(x)[0, 0, 0],
                    b["image"]["bytes"],
                    fn_output_signature=tf.uint8,
                )
            )
        )

    loader = ResumableLoader.from_pipeline(pipeline(), num_epochs=1)
    batches = iter(loader)
    first = next(batches).numpy().tolist()
    state = loader.get_state()
    rest = [b.numpy().tolist() for b in batches]
    assert sorted(first + [x for batch in rest for x in batch]) == list(range(6))
    assert not any("fill_values" in key for key in state)
    assert state["source.fingerprint"] == ds._fingerprint
    again = ResumableLoader.from_pipeline(pipeline(), num_epochs=1)
    again.set_state(state)
    assert [b.numpy().tolist() for b in again] == rest
    raw = HuggingFaceSource(ds).read(3)
    assert raw["image"] == {"bytes": pngs[3], "path": ""}


def test_hugging_face_dataset_dict_refused_naming_splits():
    """A DatasetDict needs a split chosen."""
    with pytest.raises(TypeError) as info:
        adapt(datasets.DatasetDict({"train": _dataset()}))

    assert "dataset['train']" in str(info.value)


def test_loader_restore_with_transformed_dataset_refused():
    """Another transform of the dataset (same length) has another fingerprint: refused."""
    ds = _dataset()
    state = ResumableLoader(ds, batch_size=4, seed=0).get_state()
    changed = ds.map(lambda row: {"label": 0})

    with pytest.raises(StateMismatchError) as info:
        ResumableLoader(changed, batch_size=4, seed=0).set_state(state)

    assert "source.fingerprint" in str(info.value)


# -- missing values and selected columns -----------------------------------------------


def test_loader_hugging_face_null_int_raises_record_error_naming_column_and_row():
    """A null in an int64 column is a RecordError naming column and row, never a sentinel."""
    ds = datasets.Dataset.from_dict({"x": [1, None, 3]})
    loader = ResumableLoader(ds, batch_size=3, seed=0, shuffle=False)

    with pytest.raises(RecordError) as info:
        next(iter(loader))

    message = str(info.value)
    assert "Column ['x'] has a missing (null) value in row 1" in message
    assert info.value.record_index == 1
    assert isinstance(info.value.__cause__, MissingValueError)


@pytest.mark.parametrize(
    ("column", "feature", "rows", "named"),
    [
        ("s", datasets.Value("string"), ["a", None, "c"], "['s']"),
        ("t", datasets.Sequence(datasets.Value("int32")), [[1], [2, None], [3]], "['t']"),
        (
            "image",
            datasets.Image(decode=False),
            [{"bytes": b"a", "path": "a.png"}, {"bytes": None, "path": "b.png"}, {"bytes": b"c"}],
            "['image']['bytes']",
        ),
        (
            "image",
            datasets.Image(decode=False),
            [{"bytes": b"a"}, None, {"bytes": b"c"}],
            "['image']['bytes']",
        ),
    ],
    ids=["string", "list-element", "image-bytes", "image-missing"],
)
def test_loader_hugging_face_null_value_names_record_and_column(column, feature, rows, named):
    """A null string, list element, image bytes (an image stored by path only) or image:
    RecordError naming record and column."""
    ds = datasets.Dataset.from_dict({column: rows}, features=datasets.Features({column: feature}))
    loader = ResumableLoader(ds, batch_size=3, seed=0, shuffle=False)

    with pytest.raises(RecordError) as info:
        next(iter(loader))

    assert f"Column {named} has a missing (null)" in str(info.value)
    assert info.value.record_index == 1
    assert "fill_values=" in str(info.value)


def test_hugging_face_fill_values_replace_missing_values():
    """Declared fill values replace nulls: scalars, list elements, list rows, struct fields."""
    features = datasets.Features(
        {
            "x": datasets.Value("int64"),
            "s": datasets.Value("string"),
            "t": datasets.Sequence(datasets.Value("int64")),
            "u": datasets.Sequence(datasets.Value("int64")),
            "image": datasets.Image(decode=False),
        }
    )
    data = {
        "x": [1, None, 3],
        "s": [None, "b", "c"],
        "t": [[1, None], [2], [3]],
        "u": [[1], None, [3]],
        "image": [{"bytes": b"p0", "path": None}, {"bytes": b"p1", "path": "1.png"}, None],
    }
    ds = datasets.Dataset.from_dict(data, features=features)
    fill = {"x": -1, "s": "?", "t": 0, "u": [9, 9], "image": {"bytes": b"", "path": ""}}
    loader = ResumableLoader(
        HuggingFaceSource(ds, fill_values=fill), batch_size=3, seed=0, shuffle=False
    )

    batch = next(iter(loader))

    assert batch["x"].numpy().tolist() == [1, -1, 3]
    assert batch["s"].numpy().tolist() == [b"?", b"b", b"c"]
    assert batch["t"].to_list() == [[1, 0], [2], [3]]
    assert batch["u"].to_list() == [[1], [9, 9], [3]]
    assert batch["image"]["path"].numpy().tolist() == [b"", b"1.png", b""]
    assert batch["image"]["bytes"].numpy().tolist() == [b"p0", b"p1", b""]
    assert "source.fill_values" in loader.get_state()


def test_hugging_face_set_format_columns_selects_what_is_read():
    """`set_format(columns=...)` is respected: only those columns are read and batched."""
    ds = _dataset()
    ds.set_format(columns=["text", "label"])
    loader = ResumableLoader(ds, batch_size=4, seed=0)

    batch = next(iter(loader))

    assert sorted(batch) == ["label", "text"]
    assert loader.get_state()["source.columns"] == "text,label"
