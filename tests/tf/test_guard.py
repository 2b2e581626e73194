"""loader.dataset() is guarded: tf.data ops that lose or repeat records raise, the safe ones
keep the stream exact and stay guarded, and a finite loader has a known length."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import ResumableLoader

SAFE_OPS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "safe-ops.md"


def _loader(**kwargs) -> ResumableLoader:
    options = dict(batch_size=4, seed=3, num_epochs=1)
    options.update(kwargs)
    return ResumableLoader(np.arange(20), **options)


def _ids(batch) -> list[int]:
    return np.asarray(batch).tolist()


def test_dataset_repeat_on_finite_loader_raises_naming_num_epochs():
    """dataset().repeat(3) on a finite loader raises before any batch, naming num_epochs."""
    loader = _loader(prefetch=None)
    seen = []

    with pytest.raises(resumeloader.ResumeLoaderError, match="repeat") as info:
        for batch in loader.dataset().repeat(3):
            seen.append(_ids(batch))
            loader.advance()

    assert "num_epochs=" in str(info.value)
    assert seen == [] and loader.position == 0


def test_dataset_repeat_on_endless_loader_keeps_the_stream():
    """repeat() on an endless loader's dataset changes nothing (it never ends)."""
    loader = _loader(num_epochs=None)
    want = [_ids(b) for b, _ in zip(_loader(num_epochs=None), range(7), strict=False)]

    got = [_ids(b) for b, _ in zip(loader.dataset().repeat(), range(7), strict=False)]

    assert got == want


# Each unsafe op with arguments that make it run; (name, call).
_UNSAFE_CALLS = {
    "shuffle": lambda ds: ds.shuffle(8),
    "filter": lambda ds: ds.filter(lambda b: tf.reduce_sum(b) > 0),
    "ignore_errors": lambda ds: ds.ignore_errors(),
    "unique": lambda ds: ds.unique(),
    "skip": lambda ds: ds.skip(1),
    "shard": lambda ds: ds.shard(2, 0),
    "unbatch-shuffle-batch": lambda ds: ds.unbatch().shuffle(500).batch(4),
    "batch": lambda ds: ds.batch(2),
    "padded_batch": lambda ds: ds.padded_batch(2),
    "ragged_batch": lambda ds: ds.ragged_batch(2),
    "sparse_batch": lambda ds: ds.sparse_batch(2, [8]),
    "rebatch": lambda ds: ds.rebatch(2),
    "window": lambda ds: ds.window(2),
    "group_by_window": lambda ds: ds.group_by_window(lambda b: tf.constant(0, tf.int64),
                                                     lambda k, w: w, window_size=2),
    "bucket_by_sequence_length": lambda ds: ds.bucket_by_sequence_length(
        lambda b: tf.shape(b)[0], [3], [2, 2]),
    "apply-bucket_by_sequence_length": lambda ds: ds.apply(
        tf.data.experimental.bucket_by_sequence_length(lambda b: tf.shape(b)[0], [3], [2, 2])),
    "apply-ignore_errors": lambda ds: ds.apply(tf.data.experimental.ignore_errors()),
    "rejection_resample": lambda ds: ds.rejection_resample(
        lambda b: tf.constant(0, tf.int32), [1.0]),
    "flat_map": lambda ds: ds.flat_map(tf.data.Dataset.from_tensor_slices),
    "interleave": lambda ds: ds.interleave(tf.data.Dataset.from_tensor_slices),
    "concatenate": lambda ds: ds.concatenate(ds),
    "cache": lambda ds: ds.cache(),
    "snapshot": lambda ds: ds.snapshot("/nonexistent"),
    "map-then-shuffle": lambda ds: ds.map(lambda b: b * 2).prefetch(2).shuffle(8),
}


@pytest.mark.parametrize("op", list(_UNSAFE_CALLS), ids=list(_UNSAFE_CALLS))
def test_dataset_unsafe_op_raises_naming_the_alternative(op):
    """An op after dataset() that drops, repeats, reorders or regroups batches raises."""
    loader = _loader()

    with pytest.raises(resumeloader.ResumeLoaderError, match="lose or repeat") as info:
        _UNSAFE_CALLS[op](loader.dataset())

    name = re.search(r"^`(\w+)` after `loader.dataset\(\)`", str(info.value)).group(1)
    assert name in type(loader.dataset()).REFUSED
    assert "Instead: " in str(info.value)
    assert loader.position == 0


def _consume(ds, loader) -> list[list[int]]:
    seen = []
    for element in ds:
        seen.append(element)
        loader.advance()
    return seen


_SAFE_CALLS = {
    "map": lambda ds: ds.map(lambda b: b * 10),
    "prefetch": lambda ds: ds.prefetch(3),
    "take_while": lambda ds: ds.take_while(lambda b: tf.reduce_min(b) >= 0),
    "enumerate": lambda ds: ds.enumerate().map(lambda i, b: b),
    "scan": lambda ds: ds.scan(tf.constant(0, tf.int64), lambda s, b: (s + 1, b)),
    "with_options": lambda ds: ds.with_options(tf.data.Options()),
    "apply-map": lambda ds: ds.apply(lambda d: d.map(lambda b: b + 1)),
    "zip-with-other": lambda ds: tf.data.Dataset.zip((ds, tf.data.Dataset.range(100))).map(
        lambda b, _: b),
}


@pytest.mark.parametrize("op", list(_SAFE_CALLS), ids=list(_SAFE_CALLS))
def test_dataset_safe_op_resumes_exactly(op, tmp_path):
    """A safe op keeps one element per batch in order: a restore mid-way resumes exactly."""
    loader = _loader()
    reference = [_ids(e) for e in _consume(_SAFE_CALLS[op](loader.dataset()), loader)]
    loader = _loader()
    head = []
    for element in _SAFE_CALLS[op](loader.dataset()):
        head.append(_ids(element))
        loader.advance()
        if len(head) == 2:
            break
    path = tf.train.Checkpoint(loader=loader).write(str(tmp_path / "ckpt"))
    fresh = _loader()
    tf.train.Checkpoint(loader=fresh).read(path)

    tail = [_ids(e) for e in _consume(_SAFE_CALLS[op](fresh.dataset()), fresh)]

    assert head + tail == reference
    assert len(reference) == 5


def test_dataset_take_yields_the_next_batches_from_the_position():
    """take(n) yields the next n batches of each iteration, each counted by its advance."""
    loader = _loader()
    ds = loader.dataset().take(2)

    first = [_ids(b) for b in _consume(ds, loader)]
    second = [_ids(b) for b in _consume(ds, loader)]

    assert first + second == [_ids(b) for b in _loader()][:4]
    assert loader.position == 16


@pytest.mark.parametrize(
    "op", ["map", "prefetch", "take", "enumerate", "with_options"], ids=str
)
def test_dataset_safe_op_returns_a_guarded_dataset(op):
    """What a safe op returns refuses unsafe ops too: the guard follows the chain."""
    calls = {**_SAFE_CALLS, "take": lambda ds: ds.take(3)}
    ds = calls[op](_loader().dataset())

    with pytest.raises(resumeloader.ResumeLoaderError, match="`shuffle` after"):
        ds.shuffle(4)
    assert type(ds) is type(_loader().dataset())


def test_dataset_unguarded_allows_ops_for_code_that_counts_itself():
    """unguarded() is the plain dataset, for code that counts consumed batches itself."""
    loader = _loader()

    records = [int(r) for r in loader.dataset().unguarded().unbatch()]

    assert sorted(records) == list(range(20))


# -- length and cardinality ------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_epochs", "drop_remainder", "consumed", "want"),
    [(1, False, 0, 5), (2, False, 3, 7), (2, True, 0, 8), (2, True, 4, 4), (1, False, 5, 0)],
    ids=["fresh", "mid-run", "drop-remainder", "drop-remainder-epoch-boundary", "exhausted"],
)
def test_len_finite_loader_counts_the_batches_left(num_epochs, drop_remainder, consumed, want):
    """len(loader) is the number of batches `for batch in loader` yields from the position."""
    loader = ResumableLoader(np.arange(18), batch_size=4, seed=0, num_epochs=num_epochs,
                             drop_remainder=drop_remainder)
    loader.advance(consumed)

    assert len(loader) == want
    assert len(list(loader.dataset())) == want == int(loader.dataset().cardinality())
    assert sum(1 for _ in loader) == want


def test_len_endless_loader_raises_type_error():
    """len() of an endless loader raises a TypeError naming num_epochs."""
    loader = _loader(num_epochs=None)

    with pytest.raises(TypeError, match="endless") as info:
        len(loader)

    assert "num_epochs=None" in str(info.value)
    assert int(loader.dataset().cardinality()) == tf.data.INFINITE_CARDINALITY


@pytest.mark.parametrize("num_epochs", [None, 1], ids=["endless", "exhausted"])
def test_loader_is_truthy_whatever_its_length(num_epochs):
    """bool(loader) is True for an endless and for an exhausted loader (len() aside)."""
    loader = _loader(num_epochs=num_epochs)
    if num_epochs is not None:
        loader.advance(5)

    assert bool(loader) is True


def test_dataset_cardinality_follows_map_prefetch_and_take():
    """map and prefetch keep the cardinality; take(n) caps it."""
    loader = _loader()

    ds = loader.dataset().map(lambda b: b).prefetch(2)

    assert int(ds.cardinality()) == 5 and len(ds) == 5
    assert int(ds.take(3).cardinality()) == 3
    assert int(ds.take(9).cardinality()) == 5


def test_docs_table_lists_every_refused_op():
    """The docs' table of unsafe ops (generated from the guard's list) names every refused op."""
    text = SAFE_OPS_PAGE.read_text()

    missing = [name for name in type(_loader().dataset()).REFUSED if f"| `{name}` |" not in text]

    assert missing == []
