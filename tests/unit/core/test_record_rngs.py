"""RecordRngs: every row's draws computed together equal that row's NumPy generator, call
after call, and are pinned."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.core import draws, rng, streams, ziggurat

# (method, positional arguments, keyword arguments), as a user calls NumPy.
_CALLS = [
    ("random", (), {}),
    ("random", ((3,),), {}),
    ("random", (), {"size": 5, "dtype": np.float32}),
    ("random", (2,), {"dtype": "f"}),
    ("uniform", (-2.0, 3.0, (2, 2)), {}),
    ("uniform", (np.float32(0.25), 4), {"size": 3}),
    ("normal", (), {}),
    ("normal", (1.0, 2.0, (7,)), {}),
    ("normal", (0.5, 0.0), {"size": 2}),
    ("normal", (0, 1, (24,)), {}),
    ("integers", (0, 10, (3,)), {}),
    ("integers", (5,), {"size": 1}),
    ("integers", (-3, 2**40, (2,)), {}),
    ("integers", (0, 7), {"size": 3, "dtype": np.int32}),
    ("integers", (0, 2**32 - 1), {"size": 3, "dtype": np.uint32, "endpoint": True}),
    ("integers", (0, 2**32), {"size": 3}),
    ("integers", (-(2**63), 2**63 - 1), {"size": 2, "endpoint": True}),
    ("integers", (0, 3**39), {"size": 4, "dtype": np.uint64}),
    ("integers", (3, 3), {"size": 2, "endpoint": True}),
    ("integers", (0, 1), {"size": 3}),
    ("integers", (0, 200), {"size": 3, "dtype": np.uint8}),
    ("uniform", (np.array([0.0, 1.0]), 2.0, (2,)), {}),
    ("integers", (np.array([0, 5]), 9), {"size": 2}),
    ("normal", (0, 1, (streams.LARGE + 1,)), {}),
    ("random", (), {"size": (2, 0)}),
]
_SEED = 20


def _rows(seed: int, epoch: int, indices: np.ndarray) -> list[np.random.Generator]:
    """Each row's generator made alone: the reference."""
    return [rng.record_rng(seed ^ rng.BATCH_STREAM, epoch, int(i)) for i in indices]


def _row_by_row(generators, name, args, kwargs):
    return np.stack([np.asarray(getattr(g, name)(*args, **kwargs)) for g in generators])


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 50),
    indices=st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=40),
    steps=st.lists(st.tuples(st.integers(0, len(_CALLS) - 1), st.integers(-8, 40)),
                   max_size=10),
)
def test_record_rngs_any_call_sequence_equals_each_rows_generator(seed, epoch, indices, steps):
    """Row i of every call is what row i's own generator gives at that point, for any
    sequence of calls (and of draws from a row handed out as a generator)."""
    indices = np.array(indices, np.int64)
    rngs, reference = rng.RecordRngs(seed, epoch, indices), _rows(seed, epoch, indices)
    for call, row in steps:
        if 0 <= row < len(indices):  # a draw from one row's own generator in between
            assert rngs[row].integers(0, 100, 2).tolist() == (
                reference[row].integers(0, 100, 2).tolist())
        name, args, kwargs = _CALLS[call]
        got = getattr(rngs, name)(*args, **kwargs)
        want = _row_by_row(reference, name, args, kwargs)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("call", range(len(_CALLS)), ids=[
    f"{name}-{i}" for i, (name, _, _) in enumerate(_CALLS)])
def test_record_rngs_call_then_rows_continue_their_streams(call):
    """After any call, every row's generator continues its stream exactly."""
    indices = np.arange(0, 600, 7)
    rngs, reference = rng.RecordRngs(_SEED, 1, indices), _rows(_SEED, 1, indices)
    name, args, kwargs = _CALLS[call]
    getattr(rngs, name)(*args, **kwargs)
    _row_by_row(reference, name, args, kwargs)
    for mine, theirs in zip(rngs, reference, strict=True):
        assert mine.integers(0, 2**32, 3, dtype=np.uint32).tolist() == (
            theirs.integers(0, 2**32, 3, dtype=np.uint32).tolist())
        assert mine.random(2).tolist() == theirs.random(2).tolist()


def test_record_rngs_normal_many_refusals_equals_each_rows_generator():
    """Normals past the ziggurat's fast region (most rows refuse one here) come out right."""
    indices = np.arange(256)
    got = rng.RecordRngs(3, 0, indices).normal(2.0, 0.5, (40,))
    want = _row_by_row(_rows(3, 0, indices), "normal", (2.0, 0.5, (40,)), {})
    np.testing.assert_array_equal(got, want)


def test_record_rngs_draws_pinned():
    """A sequence of draws of three rows is pinned bit for bit (0.3 drew the same values
    row by row; a change is a breaking change)."""
    rngs = rng.RecordRngs(7, 3, np.array([0, 5, 2**40]))
    assert rngs.random().tolist() == [0.7173119831972339, 0.28805261898193735, 0.34894998787120446]
    assert rngs.integers(0, 10, shape=(3,)).tolist() == [[2, 2, 4], [3, 7, 5], [6, 3, 0]]
    assert rngs.normal(shape=(2,)).tolist() == [
        [0.8035290098093781, -0.11501096274278387],
        [-0.016470927237366484, -1.519785288174679],
        [0.19715328240004187, 0.27556938211474197],
    ]
    assert rngs.uniform(0.5, 1.5).tolist() == [
        1.2957369516513975, 0.7640282244359844, 1.1788340607126355]
    assert rngs.random(size=2, dtype=np.float32).tolist() == [
        [0.7170615792274475, 0.4667615294456482],
        [0.7291366457939148, 0.7681278586387634],
        [0.9949066638946533, 0.21628731489181519],
    ]


def test_record_rngs_size_spelling_same_as_shape():
    """NumPy's `size=` gives what `shape=` gives."""
    indices = np.arange(5)
    by_size = rng.RecordRngs(1, 0, indices).integers(0, 9, size=(2, 3))
    by_shape = rng.RecordRngs(1, 0, indices).integers(0, 9, shape=(2, 3))
    np.testing.assert_array_equal(by_size, by_shape)


def test_record_rngs_shape_and_size_raises_type_error():
    """The shape given twice (`shape` and `size`) is a TypeError naming both."""
    with pytest.raises(TypeError) as excinfo:
        rng.RecordRngs(1, 0, np.arange(3)).random((2,), size=2)
    assert "Received: shape=(2,), size=2" in str(excinfo.value)


def test_record_rngs_negative_shape_raises_value_error():
    """A negative dimension is a ValueError naming the shape."""
    with pytest.raises(ValueError) as excinfo:
        rng.RecordRngs(1, 0, np.arange(3)).normal(size=(2, -1))
    assert "Received: shape=(2, -1)" in str(excinfo.value)


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [("normal", (0.0, -1.0), ValueError), ("integers", (5, 5), ValueError),
     ("uniform", (0.0, np.inf), OverflowError), ("random", ((), np.int64), TypeError)],
    ids=["negative-scale", "empty-range", "infinite-range", "integer-dtype"],
)
def test_record_rngs_bad_parameters_raise_numpys_error(name, args, error):
    """Parameters NumPy refuses raise NumPy's own error, before any row draws."""
    rngs = rng.RecordRngs(1, 0, np.arange(3))
    with pytest.raises(error):
        getattr(rngs, name)(*args)
    want = _row_by_row(_rows(1, 0, np.arange(3)), "random", (), {})
    assert rngs.random().tolist() == want.tolist()


def test_record_rngs_negative_index_raises_value_error():
    """A negative record index is refused when the rows are made."""
    with pytest.raises(ValueError) as excinfo:
        rng.RecordRngs(1, 0, np.array([3, -2]))
    assert "Received: indices containing -2" in str(excinfo.value)


def test_record_rngs_no_rows_gives_empty_draws():
    """An empty batch draws nothing and returns [0, *shape] arrays of the right dtype."""
    rngs = rng.RecordRngs(1, 0, np.zeros(0, np.int64))
    assert rngs.integers(0, 4, size=3, dtype=np.int32).shape == (0, 3)
    assert rngs.integers(0, 4, size=3, dtype=np.int32).dtype == np.int32


def test_ziggurat_tables_bounds_equal_numpys_fast_path_at_every_layer():
    """For each of the 256 layers, the last word the fast path takes and the first it
    refuses are classified as NumPy does, with NumPy's value."""
    found = ziggurat.tables()
    assert found is not None
    probe = ziggurat._Probe()
    for layer in range(256):
        bound = int(found[1][layer])
        for rabs in {max(bound - 1, 0), min(bound, 2**52 - 1)}:
            word = layer | 1 << 8 | rabs << 9  # negative sign
            value, taken = probe.draw(word)
            x, refused = ziggurat.normals(np.array([word], np.uint64), found)
            assert bool(refused[0]) is not taken
            if taken:
                assert x[0] == value


def test_integers_draw_other_dtype_is_left_to_numpy():
    """Bounded integers of a dtype NumPy fills with 8- or 16-bit buffers are not drawn
    together (None): NumPy draws them row by row."""
    assert draws.integers(0, 9, np.dtype(np.int16), endpoint=False) is None


def test_record_rngs_over_views_of_one_order_equal_each_rows_generator():
    # Batches whose indices are views of one longer array (the plan's chunk) take their
    # first Philox blocks from a run computed for the rows ahead: the same draws.
    order = np.random.default_rng(4).permutation(5000).astype(np.int64)
    for start, rows, epoch in [(0, 128, 0), (128, 128, 0), (1000, 100, 0), (1100, 5, 3),
                               (4990, 10, 3), (256, 128, 0), (0, 128, 1)]:
        indices = order[start : start + rows]
        rngs = rng.RecordRngs(_SEED, epoch, indices)
        got = [rngs.random(), rngs.integers(0, 9, size=2), rngs.normal(size=6),
               rngs.uniform(0.8, 1.2, 3)]
        rows_alone = _rows(_SEED, epoch, indices)
        want = [_row_by_row(rows_alone, "random", (), {}),
                _row_by_row(rows_alone, "integers", (0, 9), {"size": 2}),
                _row_by_row(rows_alone, "normal", (), {"size": 6}),
                _row_by_row(rows_alone, "uniform", (0.8, 1.2, 3), {})]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    assert any(run.base is order for run in streams._runs)  # the batches took its blocks


def test_record_rngs_over_a_view_changed_in_place_draw_from_the_new_indices():
    # The run kept for the rows ahead is Philox of the keys it saw: a view whose array
    # was changed since gets the new keys' draws, never the kept ones.
    order = np.arange(2000, dtype=np.int64)
    first = rng.RecordRngs(_SEED, 0, order[:64]).random()
    order[64:128] += 5000
    second = rng.RecordRngs(_SEED, 0, order[64:128]).random()
    np.testing.assert_array_equal(
        first, _row_by_row(_rows(_SEED, 0, np.arange(64)), "random", (), {}))
    np.testing.assert_array_equal(
        second, _row_by_row(_rows(_SEED, 0, np.arange(5064, 5128)), "random", (), {}))


def test_record_rngs_repeated_calls_keep_numpys_sign_of_zero():
    """Draws kept per arguments tell 0.0 from -0.0: each call's sign bits are NumPy's."""
    indices = np.arange(6)
    rngs, rows_alone = rng.RecordRngs(_SEED, 0, indices), _rows(_SEED, 0, indices)
    for loc, scale in [(0.0, 0.0), (-0.0, 0.0), (0.0, 0.0), (-0.0, 0.0)]:
        got = rngs.normal(loc, scale, 4)
        want = _row_by_row(rows_alone, "normal", (loc, scale, 4), {})
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    for low, high in [(0.5, 1.5), (0.5, 1.5), (1, 3), (np.float32(1), 3.0)]:
        got = rngs.uniform(low, high, 2)
        np.testing.assert_array_equal(got, _row_by_row(rows_alone, "uniform", (low, high, 2), {}))
