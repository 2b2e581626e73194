"""The ``graph`` delivery path (`tfdata/graph_path.py`): which loaders take it, the same
stream as the other paths bit for bit (golden vectors shared with NumPy), no
``from_generator`` and one Python call per iteration, and the ledger's checks on it."""

from __future__ import annotations

import collections
import threading

import _golden
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import resumeloader as rl
from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import eager_gather, gather, graph_path, paths

_IMAGES = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)
_LABELS = np.arange(37, dtype=np.int64) % 5


def _at_offset(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `array` whose data starts `offset` bytes past a 64-byte boundary."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    view = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


# One column TensorFlow reads in place (aligned), one gathered by NumPy per chunk (16
# bytes off, as large NumPy and np.load arrays are).
_MIXED = {"aligned": _at_offset(_IMAGES, 0), "unaligned": _at_offset(_LABELS, 16)}


def _path(loader: rl.ResumableLoader) -> str:
    engine = engine_lib.Engine(loader.plan, loader.workers, with_metadata=loader.with_metadata)
    return paths.path_class(engine).name


def _double(batch, seeds):
    return batch * 2.0


# name -> (pipeline, from_pipeline keywords)
GRAPH = {
    "shuffled-array": (lambda: rl.Pipeline(_IMAGES, seed=1).shuffle().batch(5), {}),
    "natural-order": (lambda: rl.Pipeline(_IMAGES, seed=1).batch(4, drop_remainder=True), {}),
    "block-order-dict": (
        lambda: rl.Pipeline({"x": _IMAGES, "y": _LABELS}, seed=2)
        .shuffle(chunk_records=4, window_chunks=3).batch(3), {}),
    "tuple-shard-2-of-3": (
        lambda: rl.Pipeline((_IMAGES, _LABELS), seed=3).shuffle().batch(2),
        {"shard": rl.Shard(2, 3)}),
    "metadata-drop-remainder": (
        lambda: rl.Pipeline(_IMAGES, seed=4).shuffle().batch(6, drop_remainder=True),
        {"with_metadata": True}),
    "tf_map": (lambda: rl.Pipeline(_IMAGES, seed=5).shuffle().batch(5).tf_map(_double), {}),
    "aligned-and-unaligned-columns": (
        lambda: rl.Pipeline(_MIXED, seed=6).shuffle().batch(4), {"with_metadata": True}),
    "unaligned-drop-remainder": (
        lambda: rl.Pipeline(_at_offset(_IMAGES, 16), seed=7).shuffle().batch(
            4, drop_remainder=True), {}),
    "unaligned-block-order-shard-1-of-2": (
        lambda: rl.Pipeline(_at_offset(_IMAGES, 16), seed=8).shuffle(
            chunk_records=4, window_chunks=3).batch(3), {"shard": rl.Shard(1, 2)}),
}

OTHER = {
    "map_fn": (lambda: rl.Pipeline(_IMAGES, seed=1).map(lambda r, rng: r).batch(5), {}),
    "thread-workers": (
        lambda: rl.Pipeline(_IMAGES, seed=1).batch(5), {"workers": rl.Workers(2)}),
    "skip": (lambda: rl.Pipeline(_IMAGES, seed=1).skip(3, 8).batch(5), {}),
    "mixture": (
        lambda: rl.Pipeline.mix({"a": _IMAGES, "b": _IMAGES[:9]},
                                weights={"a": 0.5, "b": 0.5}, seed=1).batch(5), {}),
    "strings": (lambda: rl.Pipeline(np.array([b"a", b"bc"] * 5), seed=1).batch(2), {}),
}


def _loader(case, num_epochs=3, **keywords) -> rl.ResumableLoader:
    make, options = case
    return rl.ResumableLoader.from_pipeline(make(), num_epochs=num_epochs,
                                            **{**options, **keywords})


def _numpy(batch):
    return tf.nest.map_structure(lambda t: t.numpy().tolist(), batch)


@pytest.mark.parametrize("name", GRAPH, ids=str)
def test_in_memory_columns_without_python_stages_take_the_graph_path(name):
    """In-memory numeric columns, a stacking batch stage, the sampler or the block order,
    no workers: the graph path, named by describe()."""
    loader = _loader(GRAPH[name])
    assert _path(loader) == "graph"
    assert "graph path:" in loader.describe()


@pytest.mark.parametrize("name", OTHER, ids=str)
def test_python_stages_workers_skips_mixtures_take_another_path(name):
    """Python stages, workers, skipped ranges, mixtures, strings: not the graph path."""
    assert _path(_loader(OTHER[name])) != "graph"


@pytest.mark.parametrize("rest_of_epoch", [False, True], ids=["whole", "rest-of-epoch"])
@pytest.mark.parametrize("start", [0, 7, 24], ids=["start-0", "mid-epoch", "next-epoch"])
@pytest.mark.parametrize("name", GRAPH, ids=str)
def test_graph_path_stream_equals_the_gather_paths(name, start, rest_of_epoch, monkeypatch):
    """From any position, the graph path's batches are the gather path's, bit for bit
    (data, metadata, tensor stages)."""
    def stream() -> list:
        loader = _loader(GRAPH[name])
        loader.advance(start // loader.batch_size)
        return [_numpy(b) for b in loader.dataset(rest_of_epoch=rest_of_epoch)]

    ours = stream()
    monkeypatch.setattr(paths, "PATHS", tuple(p for p in paths.PATHS
                                               if p is not graph_path.GraphPath))
    assert ours == stream()
    assert ours  # not vacuous


@pytest.mark.parametrize("rest_of_epoch", [False, True], ids=["whole", "rest-of-epoch"])
@pytest.mark.parametrize("drop", [False, True], ids=["keep-remainder", "drop-remainder"])
@pytest.mark.parametrize(
    "keywords",
    [{"num_epochs": 3}, {"num_epochs": None}, {"num_epochs": 3, "shard": rl.Shard(1, 2)}],
    ids=["finite", "endless", "shard-1-of-2"])
def test_graph_path_unaligned_chunks_of_few_batches_equal_the_gather_paths(
        keywords, drop, rest_of_epoch, monkeypatch):
    """Over a column NumPy gathers, Python places each chunk (several per epoch here, the
    last one short) from a mid-epoch start across epochs: the gather path's batches."""
    monkeypatch.setattr(graph_path, "CHUNK_BYTES", 4 * _IMAGES[:1].nbytes)  # 2 batches

    def stream() -> list:
        pipeline = rl.Pipeline(_at_offset(_IMAGES, 16), seed=9).shuffle().batch(
            2, drop_remainder=drop)
        loader = rl.ResumableLoader.from_pipeline(pipeline, with_metadata=True, **keywords)
        loader.advance(3)
        return [_numpy(b) for b in loader.dataset(rest_of_epoch=rest_of_epoch).take(45)]

    ours = stream()
    monkeypatch.setattr(paths, "PATHS", tuple(p for p in paths.PATHS
                                               if p is not graph_path.GraphPath))
    assert ours == stream()
    assert len(ours) > 5  # several chunks


@pytest.mark.parametrize(
    ("key", "expected"),
    [(k, v) for k, v in _golden.SAMPLER.items() if k[0] <= 1000],
    ids=lambda x: str(x) if isinstance(x, tuple) else "",
)
def test_graph_path_first_batch_of_an_epoch_is_the_golden_vector(key, expected):
    """The first batch of epoch e over ``arange(n)`` is the pinned NumPy order."""
    num_records, seed, epoch = key
    loader = rl.ResumableLoader(np.arange(num_records), batch_size=len(expected), seed=seed)
    loader.set_state(dict(loader.get_state(), epoch=epoch, offset=0))
    assert _path(loader) == "graph"
    assert next(iter(loader.dataset())).numpy().tolist() == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [(k, v) for k, v in _golden.SAMPLER.items() if k[0] <= 1000],
    ids=lambda x: str(x) if isinstance(x, tuple) else "",
)
def test_eager_loop_first_batch_of_an_epoch_is_the_golden_vector(key, expected):
    """``for batch in loader`` over an array (chunks gathered at once, DLPack views)
    gives the pinned NumPy order too, and the second batch follows it in that order."""
    num_records, seed, epoch = key
    loader = rl.ResumableLoader(np.arange(num_records), batch_size=len(expected), seed=seed)
    loader.set_state(dict(loader.get_state(), epoch=epoch, offset=0))
    batches = iter(loader)
    first = next(batches).numpy().tolist()
    assert first == expected
    second = next(batches).numpy().tolist()
    if 2 * len(expected) <= num_records:  # both in the epoch: no record twice
        assert not set(first) & set(second)
    else:  # the batch was the whole epoch: the next epoch's first batch
        assert sorted(second) == sorted(first) and second != first


def test_graph_path_block_order_first_batch_is_the_golden_vector():
    """The block order's pinned first records, through the graph path."""
    (num_records, chunk, window, seed, epoch), expected = next(iter(_golden.BLOCKS.items()))
    pipeline = rl.Pipeline(np.arange(num_records), seed=seed).shuffle(
        chunk_records=chunk, window_chunks=window)
    loader = rl.ResumableLoader.from_pipeline(pipeline.batch(len(expected)))
    loader.set_state(dict(loader.get_state(), epoch=epoch, offset=0))
    assert next(iter(loader.dataset())).numpy().tolist() == expected


def test_graph_path_gathers_unaligned_columns_once_per_chunk():
    """A column TensorFlow cannot read in place is gathered by NumPy once per chunk of
    batches (one Python call per chunk in the graph, which also computes the chunk's
    record indices: no order ops in the graph), the aligned one in place."""
    loader = _loader(GRAPH["aligned-and-unaligned-columns"])
    ops = _ops(loader.dataset())
    assert ops["EagerPyFunc"] == 1  # the iteration's start
    assert ops["PyFuncStateless"] == 1  # the chunk's NumPy order and gather
    assert ops["GatherV2"] >= 1
    ops = _ops(_loader(GRAPH["unaligned-drop-remainder"]).dataset())
    assert ops["PyFuncStateless"] == 1
    assert ops["BitwiseXor"] == 0  # the order's hash and Feistel rounds are NumPy's


def test_graph_path_in_place_columns_keep_the_graph_order():
    """Columns TensorFlow reads in place keep the order in the graph: no Python per chunk."""
    pipeline = rl.Pipeline(_at_offset(_IMAGES, 0), seed=5).shuffle().batch(5)
    ops = _ops(rl.ResumableLoader.from_pipeline(pipeline, num_epochs=None).dataset())
    assert ops["PyFuncStateless"] == 0
    assert ops["BitwiseXor"] > 0
    assert ops["ScanDataset"] == 0  # the endless epochs: a range, no scan function


def _ops(ds: tf.data.Dataset) -> collections.Counter:
    graph = graph_pb2.GraphDef()
    policy = tf.data.experimental.ExternalStatePolicy.WARN
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return collections.Counter(node.op for node in nodes)


def test_graph_path_dataset_has_no_generator_and_one_python_call():
    """No from_generator; over an array TensorFlow reads in place, the only Python is
    the one call when an iteration begins."""
    pipeline = rl.Pipeline(_at_offset(_IMAGES, 0), seed=5).shuffle().batch(5).tf_map(_double)
    ops = _ops(rl.ResumableLoader.from_pipeline(pipeline).dataset())
    assert ops["GeneratorDataset"] == 0
    assert ops["EagerPyFunc"] + ops["PyFunc"] + ops["PyFuncStateless"] == 1
    assert ops["ParallelMapDatasetV2"] >= 1


def test_graph_path_advance_in_tf_function_resumes_in_a_fresh_loader():
    """Batches pulled and advanced inside a tf.function, saved, restored into a fresh
    loader: it continues with the next batch."""
    make = lambda: _loader(GRAPH["block-order-dict"], num_epochs=None)  # noqa: E731
    loader = make()
    iterator = iter(loader.dataset())

    @tf.function
    def step():
        batch = next(iterator)
        loader.advance(after=batch)
        return batch

    taken = [_numpy(step()) for _ in range(9)]
    fresh = make()
    fresh.set_state(loader.get_state())
    following = _numpy(next(iter(fresh.dataset())))
    assert following == _numpy(step())
    assert following not in taken


def test_graph_path_two_iterations_read_at_once_fail_within_a_chunk():
    """zip(ds, ds) fails the step with the ledger's message by the next chunk."""
    loader = rl.ResumableLoader(np.arange(20), batch_size=4, seed=3, num_epochs=2,
                                prefetch=None)
    ds = loader.dataset()
    pairs = 0
    with pytest.raises(tf.errors.OpError, match="Two iterations of this loader") as info:
        for _ in tf.data.Dataset.zip((ds, ds)):
            pairs += 1
            loader.advance()
    assert "StreamIntegrityError" in str(info.value)
    assert pairs <= loader.plan.layout.batches_per_epoch  # one chunk: the epoch here


def test_graph_path_iterator_from_before_a_restore_fails():
    """An iterator kept across set_state fails by its next chunk instead of handing out
    the old position's batches."""
    loader = rl.ResumableLoader(np.arange(64), batch_size=4, seed=3, prefetch=None)
    iterator = iter(loader.dataset())
    next(iterator)
    loader.advance()
    loader.set_state(loader.get_state())
    with pytest.raises(tf.errors.OpError, match="Two iterations of this loader"):
        for _ in range(loader.plan.layout.batches_per_epoch + 1):
            next(iterator)


def test_graph_path_eager_advance_past_produced_batches_raises():
    """Advancing twice per batch outruns what the iteration's chunks hold: it raises."""
    loader = rl.ResumableLoader(np.arange(20), batch_size=4, seed=3, prefetch=1)
    steps = 0
    with pytest.raises(rl.StreamIntegrityError, match="past the last batch"):
        for _ in loader.dataset():
            loader.advance(2)
            steps += 1
            assert steps < 100, "the over-count was never detected"


def _loop(loader: rl.ResumableLoader, limit: int = 60) -> list:
    """(batch, position after it) of ``for batch in loader``, at most `limit` batches."""
    out = []
    for batch in loader:
        out.append((_numpy(batch), loader.position))
        if len(out) == limit:
            break
    return out


@pytest.mark.parametrize("start", [0, 7, 24], ids=["start-0", "mid-epoch", "next-epoch"])
@pytest.mark.parametrize("name", GRAPH, ids=str)
def test_graph_path_eager_loop_equals_the_produced_path(name, start, monkeypatch):
    """``for batch in loader`` on the graph path (chunks gathered by NumPy, split per
    batch, in the loop's thread) hands out the batches of the path that makes them
    record by record through the engine (neither the graph nor the gather path: both
    loop through `eager_gather`), bit for bit, each with the same position after it,
    from any position, across epochs."""
    def stream() -> list:
        loader = _loader(GRAPH[name])
        loader.advance(start // loader.batch_size)
        return _loop(loader)

    ours = stream()
    monkeypatch.setattr(paths, "PATHS", tuple(
        p for p in paths.PATHS if p not in (graph_path.GraphPath, gather.GatherPath)))
    chunked = []
    monkeypatch.setattr(eager_gather, "batches", lambda *a, **k: chunked.append(a))
    assert ours == stream()
    assert ours and chunked == []  # not vacuous, and not compared with itself


def test_graph_path_eager_loop_chunks_grow_and_resume_inside_a_chunk():
    """Chunks of 1, 2, 4, ... batches: a loop broken off inside a chunk and a fresh
    loader restored from its state continue with the next batch, none lost or repeated."""
    data = np.arange(5000, dtype=np.int64)
    make = lambda: rl.ResumableLoader(data, batch_size=8, seed=11, num_epochs=2)  # noqa: E731
    whole = [b for b, _ in _loop(make(), limit=400)]
    for cut in (1, 2, 3, 6, 50):
        loader = make()
        head = [b for b, _ in _loop(loader, limit=cut)]
        fresh = make()
        fresh.set_state(loader.get_state())
        assert fresh.position == cut * 8
        tail = [b for b, _ in _loop(fresh, limit=400 - cut)]
        assert head + tail == whole


def test_graph_path_eager_loop_starts_no_thread():
    """The batches are gathered in the loop's own thread: no producer thread runs."""
    loader = rl.ResumableLoader(_at_offset(_IMAGES, 16), batch_size=4, seed=2, num_epochs=2)
    before = {t.ident for t in threading.enumerate()}
    for _ in loader:
        assert {t.ident for t in threading.enumerate()} <= before


def test_graph_path_eager_loop_gathers_and_checks_once_per_chunk(monkeypatch):
    """Each column is gathered, and the record indices checked, once per chunk of
    batches (1, 2, 4, ... up to MAX_BATCHES), not once per batch."""
    calls = collections.Counter()
    for owner, name in ((eager_gather, "_gather"), (eager_gather.handoff, "check_indices")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _name=name, **k: (
            calls.update([_name]), _real(*a, **k))[1])
    data = {"x": np.arange(4000, dtype=np.float32), "y": np.arange(4000) % 7}
    loader = rl.ResumableLoader(data, batch_size=4, seed=1, num_epochs=1)
    batches = sum(1 for _ in loader)
    chunks = 1
    while sum(min(2**k, eager_gather.MAX_BATCHES) for k in range(chunks)) < batches:
        chunks += 1
    assert batches == 1000
    assert calls == {"check_indices": chunks, "_gather": 2 * chunks}


@pytest.mark.parametrize("start", [0, 2, 6], ids=["start-0", "batch-2", "next-epoch"])
def test_gather_path_eager_loop_with_skips_equals_the_produced_path(start, monkeypatch):
    """A skipped range takes the gather path, whose loop gathers chunks itself too: the
    same batches and positions as the produced path's loop, from any batch."""
    def stream() -> tuple[str, list]:
        loader = _loader(OTHER["skip"], num_epochs=2)
        loader.advance(start)
        return _path(loader), _loop(loader)

    path, ours = stream()
    monkeypatch.setattr(paths, "PATHS", tuple(
        p for p in paths.PATHS if p.name not in ("graph", "gather")))
    other, theirs = stream()
    assert (path, other) == ("gather", "read_batch")
    assert ours == theirs
    assert ours  # not vacuous


@pytest.mark.parametrize("offset", [0, 16], ids=["in-place", "by-numpy"])
def test_graph_path_eager_loop_with_tf_map_after_a_dataset_epoch_reads_every_chunk(offset):
    """``for batch in loader`` with a tensor stage reads this path's dataset: after a
    ``dataset()`` iteration (which the loop supersedes) it still reads past its first
    chunk of batches (it failed there with the ledger's StreamIntegrityError)."""
    data = _at_offset(np.arange(10_000, dtype=np.int64), offset)
    pipeline = rl.Pipeline(data, seed=0).shuffle().batch(8).tf_map(lambda b, s: b + 1)
    loader = rl.ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    expected = [batch.numpy().tolist() for batch in loader.dataset()]

    assert _path(loader) == "graph"
    assert [batch.numpy().tolist() for batch in loader] == expected
    assert len(expected) == 1250
