"""In-memory columnar sources: dicts and tuples of arrays, lists and tensors are columns,
never a few huge records; ambiguous ones are refused; records are read-only for map_fn."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import RecordError, ResumableLoader, StateMismatchError
from resumeloader.sources import ArraySource, IndexableSource, adapt


def _records(loader: ResumableLoader) -> list:
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), b) for b in loader]


@pytest.mark.parametrize(
    ("source", "num_records"),
    [
        (([1.0, 2.0, 3.0], [0.0, 1.0, 0.0]), 3),
        ({"x": [1, 2, 3, 4], "y": ["a", "b", "c", "d"]}, 4),
        ((tf.zeros((5, 2)), tf.range(5)), 5),
        ({"image": np.zeros((6, 2, 2)), "label": [0, 1, 0, 1, 0, 1]}, 6),
        (tf.constant([[1, 2], [3, 4], [5, 6]]), 3),
    ],
    ids=["tuple-of-lists", "dict-of-lists", "tuple-of-tensors", "array-and-list", "tensor"],
)
def test_adapt_columnar_source_counts_rows_as_records(source, num_records):
    """Tuples, dicts, lists and tensors are columns: one record per row, not per column."""
    adapted = adapt(source)

    assert isinstance(adapted, ArraySource)
    assert len(adapted) == num_records


def test_loader_tuple_of_lists_yields_rows_as_records():
    """([1., 2., 3.], [0., 1., 0.]) is three (x, y) records."""
    loader = ResumableLoader(
        ([1.0, 2.0, 3.0], [0.0, 1.0, 0.0]), batch_size=3, seed=0, shuffle=False, num_epochs=1
    )

    assert loader.num_records == 3
    assert _records(loader)[0] == ([1.0, 2.0, 3.0], [0.0, 1.0, 0.0])


def test_loader_dict_of_lists_reads_records_by_row():
    """A dict of lists is read by row (it used to fail with a KeyError on record 0)."""
    loader = ResumableLoader(
        {"path": ["a.jpg", "b.jpg"], "label": [3, 4]}, batch_size=2, seed=0, shuffle=False
    )

    batch = next(iter(loader))

    assert batch["path"].numpy().tolist() == [b"a.jpg", b"b.jpg"]
    assert batch["label"].numpy().tolist() == [3, 4]


def test_loader_dict_with_ragged_list_column_yields_ragged_leaf():
    """A list column of arrays of different lengths is a ragged column."""
    data = {"tokens": [np.arange(n) for n in (2, 0, 3)], "label": np.array([1, 2, 3])}
    loader = ResumableLoader(data, batch_size=3, seed=0, shuffle=False)

    batch = next(iter(loader))

    assert batch["tokens"].to_list() == [[0, 1], [], [0, 1, 2]]
    assert batch["label"].numpy().tolist() == [1, 2, 3]


def test_adapt_top_level_list_is_a_sequence_of_records():
    """A list at the top is records (as tf.data stacks it), not columns."""
    adapted = adapt(["a.jpg", "b.jpg", "c.jpg", "d.jpg"])

    assert isinstance(adapted, IndexableSource)
    assert len(adapted) == 4


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ((1, 2, 3), "a scalar in it is ambiguous"),
        ({"x": np.arange(3), "y": 7}, "source['y'] = 7"),
        ({"x": [{"a": 1}, {"a": 2}]}, "A column holds structures"),
        ({"x": np.arange(3), "y": np.arange(4)}, "source['x']: 3, source['y']: 4"),
        ({"x": np.float32(2.0)}, "a scalar in it is ambiguous"),
        ((np.arange(3), np.zeros(())), "needs a leading record dimension"),
        ({"x": [np.zeros(2, np.int32), np.zeros(3, np.float32)]}, "must share a dtype"),
    ],
    ids=[
        "tuple-of-scalars",
        "scalar-beside-column",
        "list-of-dicts-column",
        "unequal-lengths",
        "numpy-scalar",
        "0-d-array",
        "mixed-dtypes",
    ],
)
def test_adapt_ambiguous_or_inconsistent_columns_raise_value_error(source, message):
    """Columns that cannot be read as rows are refused with a message naming the column."""
    with pytest.raises(ValueError) as info:
        adapt(source)

    assert message in str(info.value)


def test_adapt_tensor_columns_converted_once_to_numpy():
    """tf.Tensor columns are converted to NumPy at construction (no tensor read per record)."""
    adapted = adapt({"x": tf.range(4), "s": tf.constant(["a", "b", "c", "d"])})

    record = adapted.read(2)

    assert isinstance(record["x"], np.integer) and record["x"] == 2
    assert record["s"] == b"c"


# -- read-only records (issue 14, item 9) -----------------------------------------------


def _add_one_in_place(record, rng):
    record += 1
    return record


@pytest.mark.parametrize(
    "make_source",
    [
        lambda data: data,
        lambda data: {"x": data},
        lambda data: [row for row in data],
    ],
    ids=["array", "dict-of-arrays", "list-of-arrays"],
)
def test_loader_map_fn_changing_record_in_place_raises_and_data_unchanged(make_source):
    """Records handed to map_fn are read-only: in-place changes raise, naming the cause."""
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    original = data.copy()
    source = make_source(data)
    fn = _add_one_in_place if not isinstance(source, dict) else _add_one_to_x

    with pytest.raises(RecordError) as info:
        loader = ResumableLoader(source, batch_size=3, seed=0, map_fn=fn)
        next(iter(loader))

    assert "read-only" in str(info.value)
    assert "record.copy()" in str(info.value)
    assert np.array_equal(data, original)


def _add_one_to_x(record, rng):
    record["x"] += 1
    return record


def test_loader_map_fn_copying_first_may_change_its_copy():
    """A map_fn that copies the record first works, and the source stays unchanged."""
    data = np.zeros((4, 2), np.float32)
    loader = ResumableLoader(
        data,
        batch_size=4,
        seed=0,
        shuffle=False,
        map_fn=lambda record, rng: _add_one_in_place(record.copy(), rng),
    )

    batch = next(iter(loader))

    assert batch.numpy().tolist() == [[1.0, 1.0]] * 4
    assert not data.any()


def test_array_source_does_not_change_caller_array_flags():
    """The caller's own array stays writable (the source holds a read-only view)."""
    data = np.zeros(3)

    adapt(data).read(0)

    assert data.flags.writeable


# -- identity ---------------------------------------------------------------------------


def test_loader_restore_with_other_array_of_same_length_refused():
    """A checkpoint of np.arange(1000) does not restore into np.arange(1000) * 7."""
    state = ResumableLoader(np.arange(1000), batch_size=10, seed=0).get_state()

    with pytest.raises(StateMismatchError) as info:
        ResumableLoader(np.arange(1000) * 7, batch_size=10, seed=0).set_state(state)

    assert "source.identity" in str(info.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: {"x": np.arange(50.0), "text": [f"w{i}" for i in range(50)]},
        lambda: [np.arange(i % 7) for i in range(50)],
        lambda: np.arange(6000, dtype=np.int32).reshape(200, 30)[:, ::3],
    ],
    ids=["columns-and-strings", "ragged", "strided-view"],
)
def test_array_identity_same_for_equal_copies_differs_after_change(make):
    """Equal data (fresh copies) has one identity; changing a sampled element changes it."""
    same = [ArraySource(make()).order_fields()["identity"] for _ in range(2)]
    data = make()
    if isinstance(data, dict):
        data["text"][-1] = "changed"
    elif isinstance(data, list):
        data[0] = np.array([99])
    else:
        data = data.copy()
        data[0, 0] = -1

    assert same[0] == same[1]
    assert ArraySource(data).order_fields()["identity"] != same[0]
