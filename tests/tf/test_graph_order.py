"""The record order as TensorFlow ops (`tfdata/graph_order.py`, `tfdata/graph_batches.py`)
equals the NumPy order bit for bit: golden vectors, every small size, 2**k + 1, random
sizes, seeds and epochs, the block order, and whole plans' batches from any position."""

from __future__ import annotations

import itertools

import _golden
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader as rl
from resumeloader.core import blocks, positions, rng, sampler
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import graph_batches, graph_order


def _in_graph(num_records: int, seed: int, epoch: int, offsets: np.ndarray) -> np.ndarray:
    fn = tf.function(lambda e, o: graph_order.permute(num_records, seed, e, o))
    return fn(tf.constant(epoch, tf.int64), tf.constant(offsets)).numpy()


def _in_dataset(num_records: int, seed: int, epoch: int, offsets: np.ndarray) -> np.ndarray:
    ds = tf.data.Dataset.from_tensors(offsets).map(
        lambda o: graph_order.permute(num_records, seed, tf.constant(epoch, tf.int64), o)
    )
    return next(iter(ds)).numpy()


RUNNERS = {"eager": graph_order.permute, "tf.function": _in_graph, "dataset": _in_dataset}


@pytest.mark.parametrize("runner", RUNNERS, ids=str)
@pytest.mark.parametrize(
    ("key", "expected"), _golden.SAMPLER.items(), ids=map(str, _golden.SAMPLER)
)
def test_permute_golden_vectors_equal_numpy_pins(key, expected, runner):
    """The graph permutation gives the pinned first records eagerly, in a tf.function and
    in a tf.data map."""
    num_records, seed, epoch = key
    offsets = np.arange(len(expected), dtype=np.int64)
    got = RUNNERS[runner](num_records, seed, epoch, offsets)
    assert np.asarray(got).tolist() == expected


@pytest.mark.parametrize(("key", "expected"), _golden.BLOCKS.items(), ids=map(str, _golden.BLOCKS))
def test_block_indices_golden_vectors_equal_numpy_pins(key, expected):
    """The graph block order gives the pinned first records."""
    num_records, chunk_records, window_chunks, seed, epoch = key
    order = blocks.BlockOrder(num_records, chunk_records, window_chunks, seed)
    got = graph_order.block_indices(order, epoch, np.arange(12, dtype=np.int64))
    assert got.numpy().tolist() == expected


@pytest.mark.parametrize("num_records", [*range(1, 40), 100, 200, 255, 256], ids=str)
def test_permute_table_sizes_equal_numpy(num_records):
    """Every size of the Fisher-Yates table case gives NumPy's whole epoch, for two seeds
    and epochs (one table per call)."""
    offsets = np.arange(num_records, dtype=np.int64)
    for seed, epoch in [(0, 0), (2**64 - 1, 12345)]:
        expected = sampler.permute(num_records, seed, epoch, offsets)
        assert graph_order.permute(num_records, seed, epoch, offsets).numpy().tolist() == (
            expected.tolist()
        )


@pytest.mark.parametrize("num_records", [257, 65_537, 262_145, 1_048_577], ids=str)
def test_permute_two_to_the_k_plus_one_is_numpys_permutation(num_records):
    """At N = 2**k + 1 (where index_shuffle drops a record) the epoch is NumPy's, hence a
    permutation; cycle walking runs in the graph too."""
    offsets = np.arange(num_records, dtype=np.int64)
    expected = sampler.permute(num_records, 7, 3, offsets)
    got = _in_graph(num_records, 7, 3, offsets)
    assert np.array_equal(got, expected)
    assert np.array_equal(np.sort(got), offsets)


@settings(max_examples=60, deadline=None)
@given(
    num_records=st.integers(1, 2**40),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**62),
    data=st.data(),
)
def test_property_permute_equals_numpy(num_records, seed, epoch, data):
    """Any size up to 2**40, any seed and epoch: the graph's records at random offsets are
    NumPy's."""
    offsets = np.asarray(
        data.draw(st.lists(st.integers(0, num_records - 1), min_size=1, max_size=64)), np.int64
    )
    expected = sampler.permute(num_records, seed, epoch, offsets)
    assert np.array_equal(graph_order.permute(num_records, seed, epoch, offsets), expected)


@settings(max_examples=40, deadline=None)
@given(
    num_records=st.integers(1, 3000),
    chunk_records=st.integers(1, 300),
    window_chunks=st.integers(1, 12),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**40),
)
def test_property_block_indices_whole_epoch_equals_numpy(
    num_records, chunk_records, window_chunks, seed, epoch
):
    """Any block shape (table and Feistel windows, a short last window and chunk): the
    graph's whole epoch is NumPy's."""
    order = blocks.BlockOrder(num_records, chunk_records, window_chunks, seed)
    offsets = np.arange(num_records, dtype=np.int64)
    got = graph_order.block_indices(order, epoch, offsets)
    assert np.array_equal(got, order.indices(epoch, offsets))


@pytest.mark.parametrize(
    "offsets",
    [[0, 1, 2], [9_999_000, 9_999_999], [5, 9_999_999, 6, 4_000_123]],
    ids=["first-window", "last-window", "mixed"],
)
def test_block_indices_window_parts_alone_or_mixed_equal_numpy(offsets):
    """Offsets only in full windows, only in the short last one, or both at once (the
    two sizes computed apart and stitched back) give NumPy's records."""
    order = blocks.BlockOrder(10**7, chunk_records=64, window_chunks=3, seed=11)
    offsets = np.asarray(offsets, np.int64)
    fn = tf.function(lambda o: graph_order.block_indices(order, tf.constant(5, tf.int64), o))
    assert np.array_equal(fn(tf.constant(offsets)), order.indices(5, offsets))


def test_epoch_hash_tensor_seed_and_epoch_equal_numpy():
    """`epoch_hash` of tensor seeds and epochs is the NumPy hash of each pair."""
    seeds = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    epochs = [0, 5, 2**40, 2**62]
    got = graph_order.epoch_hash(tf.constant(seeds), tf.constant(epochs, tf.int64))
    expected = [sampler.epoch_hash(int(s), e) for s, e in zip(seeds, epochs, strict=True)]
    assert got.numpy().tolist() == expected


@pytest.mark.parametrize("num_records", [200, 50_000], ids=["table", "feistel"])
def test_epoch_keys_once_then_applied_in_tf_function_equal_permute(num_records):
    """Keys derived once per epoch and applied to several batches inside a tf.function give
    `permute`'s records."""
    keys = graph_order.epoch_keys(num_records, 9, tf.constant(4, tf.int64))
    apply = tf.function(lambda k, o: graph_order.apply_keys(num_records, k, o))
    for start in (0, 128):
        offsets = np.arange(start, start + 64, dtype=np.int64)
        assert np.array_equal(apply(keys, offsets), sampler.permute(num_records, 9, 4, offsets))


def test_graph_order_unsupported_stage_raises_type_error():
    """A mixture's order has no graph form: `GraphOrder` refuses it, naming the stage."""
    pipeline = rl.Pipeline.mix(
        {"a": np.arange(5), "b": np.arange(7)}, weights={"a": 1, "b": 1}, seed=0
    )
    assert not graph_order.GraphOrder.supports(pipeline.index_stage)
    with pytest.raises(TypeError, match="no TensorFlow form"):
        graph_order.GraphOrder(pipeline.index_stage, seed=0)


# -- batches of a plan -----------------------------------------------------------------
def _pipeline(num_records: int, kind: str, seed: int, batch: int, drop: bool) -> rl.Pipeline:
    pipeline = rl.Pipeline(np.arange(num_records), seed=seed)
    if kind == "natural":
        pipeline = pipeline.shuffle(False)
    elif kind == "shuffled":
        pipeline = pipeline.shuffle()
    else:
        pipeline = pipeline.shuffle(chunk_records=max(1, num_records // 7), window_chunks=2)
    return pipeline.batch(batch, drop_remainder=drop)


@st.composite
def plans(draw: st.DrawFn) -> tuple[plan_lib.Plan, int]:
    num_records = draw(st.integers(1, 600))
    shard_count = draw(st.integers(1, min(4, num_records)))
    per_epoch = num_records // shard_count
    batch = draw(st.integers(1, 40))
    drop = draw(st.booleans()) and batch <= per_epoch
    pipeline = _pipeline(
        num_records, draw(st.sampled_from(["natural", "shuffled", "blocks"])),
        draw(st.integers(0, 2**64 - 1)), batch, drop,
    )
    plan = plan_lib.Plan(
        pipeline,
        num_epochs=draw(st.sampled_from([None, 1, 3])),
        shard=rl.Shard(draw(st.integers(0, shard_count - 1)), shard_count),
    )
    return plan, draw(st.integers(0, 3 * per_epoch))


def _tasks(plan: plan_lib.Plan, start: int, count: int) -> list[tuple[list[int], int, int]]:
    tasks = plan.tasks(plan.layout.normalise(start))
    return [(t.indices.tolist(), t.epoch, t.position) for t in itertools.islice(tasks, count)]


@settings(max_examples=15, deadline=None)
@given(case=plans())
def test_property_dataset_batches_equal_plan_tasks(case):
    """From any start, the index dataset's batches are the plan's tasks (records, epoch,
    position), as many of them for a finite stream."""
    plan, start = case
    ds = graph_batches.GraphBatches(plan).dataset(start)
    got = [
        (b.indices.numpy().tolist(), int(b.epoch), int(b.position))
        for b in ds.take(40)
    ]
    assert got == _tasks(plan, start, 40)


@settings(max_examples=60, deadline=None)
@given(
    per_epoch=st.integers(1, 40),
    batch=st.integers(1, 50),
    drop=st.booleans(),
    num_epochs=st.one_of(st.none(), st.integers(1, 4)),
    position=st.integers(0, 200),
    num_batches=st.integers(0, 10**6),
)
def test_property_graph_layout_equals_layout(
    per_epoch, batch, drop, num_epochs, position, num_batches
):
    """Every `GraphLayout` method returns what `Layout`'s does, from any position."""
    layout = positions.Layout(per_epoch, batch, drop, num_epochs)
    ops = graph_batches.GraphLayout(layout)
    normal = layout.normalise(position)
    assert int(ops.normalise(position)) == normal
    assert int(ops.advance(position, num_batches)) == layout.advance(position, num_batches)
    assert int(ops.batches_left_in_epoch(normal)) == layout.batches_left_in_epoch(normal)
    if num_epochs is not None:
        assert int(ops.batches_to_end(normal)) == layout.batches_to_end(normal)
    if layout.end is None or normal < layout.end:
        assert int(ops.batch_end(normal)) == layout.batch_end(normal)


def test_metadata_equals_numpy_metadata():
    """Each batch's metadata (index, epoch, position, stateless seed pair) is
    `core.rng.metadata`'s."""
    plan = plan_lib.Plan(_pipeline(50, "shuffled", 2**64 - 3, 8, False), num_epochs=None)
    batches = graph_batches.GraphBatches(plan)
    for k, task in enumerate(itertools.islice(plan.tasks(13), 12)):
        got = batches.metadata(batches.batch(13, k))
        expected = rng.metadata(plan.pipeline.seed, task.indices, task.epoch, task.position)
        assert {key: value.numpy().tolist() for key, value in got.items()} == {
            key: value.tolist() for key, value in expected.items()
        }


def test_dataset_variable_start_read_when_iteration_begins():
    """A `tf.Variable` start is read when each iteration begins, not when the dataset is
    built."""
    plan = plan_lib.Plan(_pipeline(40, "shuffled", 3, 4, True), num_epochs=2)
    variable = tf.Variable(0, dtype=tf.int64)
    ds = graph_batches.GraphBatches(plan).dataset(variable)
    variable.assign(22)
    first = next(iter(ds))
    assert (int(first.position), first.indices.numpy().tolist()) == (22, _tasks(plan, 22, 1)[0][0])


def test_dataset_rest_of_epoch_ends_with_the_epoch():
    """`rest_of_epoch` ends at the end of the start's epoch, even of an endless stream."""
    plan = plan_lib.Plan(_pipeline(30, "blocks", 3, 4, False), num_epochs=None)
    ds = graph_batches.GraphBatches(plan).dataset(37, rest_of_epoch=True)
    got = [int(b.position) for b in ds]
    assert got == [37, 41, 45, 49, 53, 57]


def test_batch_in_tf_function_equals_plan_task():
    """`GraphBatches.batch` inside a tf.function with tensor start and k is the task."""
    plan = plan_lib.Plan(
        _pipeline(1000, "shuffled", 5, 32, True), num_epochs=None, shard=rl.Shard(1, 3)
    )
    batches = graph_batches.GraphBatches(plan)
    fn = tf.function(lambda s, k: batches.batch(s, k).indices)
    got = fn(tf.constant(100, tf.int64), tf.constant(25, tf.int64))
    assert got.shape == (32,)
    assert got.numpy().tolist() == _tasks(plan, 100, 26)[25][0]


def test_graph_batches_windowed_plan_raises_type_error():
    """A windowed batch stage (bucketing) has no fixed-size batch arithmetic: refused."""
    lengths = [np.arange(n % 5 + 1) for n in range(20)]
    pipeline = rl.Pipeline(lengths, seed=0).bucket_by_length(4, window=8)
    plan = plan_lib.Plan(pipeline, num_epochs=1)
    assert not graph_batches.GraphBatches.supports(plan)
    with pytest.raises(TypeError, match="no TensorFlow form"):
        graph_batches.GraphBatches(plan)
