"""The ``tfrecord_graph`` path: local TFRecord files in the block order, each window read
by TensorFlow's reader. Its batches are the ``read_batch`` path's byte for byte, from any
position; a corrupt record or a changed file raises the source's error naming the file;
what it cannot read exactly, it declines."""

from __future__ import annotations

import os

import _tfrecord_graph as common
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader, Shard, Workers
from resumeloader.sources import TFRecordSource

_CUTS, _RECORDS = common.CUTS, common.RECORDS
_lengths, _path, _values, _produced = common.lengths, common.path, common.values, common.produced


@pytest.fixture
def files(tmp_path):
    return common.write_files(tmp_path)


def _loader(folder, *, verify=True, **kwargs) -> ResumableLoader:
    source = TFRecordSource(str(folder / "part-*.tfrecord"), index_dir=str(folder / "index"),
                            verify_checksums=verify)
    return common.loader(source, **kwargs)


_SHAPES = {
    "batches-straddle-windows": {"chunk": 4, "window": 2, "batch": 5},
    "drop-remainder-metadata": {"chunk": 4, "window": 2, "batch": 5, "drop": True,
                                "metadata": True},
    "batch-over-three-windows-tf_map": {"chunk": 2, "window": 1, "batch": 5, "stages": True},
    "batch-of-one-chunk-of-one": {"chunk": 1, "window": 1, "batch": 1, "epochs": 1},
    "one-window-an-epoch": {"chunk": 41, "window": 1, "batch": 41, "metadata": True},
    "windows-of-three-chunks-last-short": {"chunk": 10, "window": 3, "batch": 4,
                                           "epochs": 3, "stages": True},
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_batches_are_the_read_batch_paths_byte_for_byte(files, monkeypatch, shape):
    """Every batch (its bytes, metadata, tensor stages' output) over several epochs is
    the from_generator path's, whatever the windows, chunks and batches."""
    kwargs = _SHAPES[shape]
    graph_loader = _loader(files, **kwargs)
    produced = _produced(monkeypatch, lambda: _loader(files, **kwargs))

    assert _path(graph_loader) == "tfrecord_graph"
    expected = [_values(b) for b in produced.dataset()]
    assert [_values(b) for b in graph_loader.dataset()] == expected
    assert len(expected) == graph_loader.plan.layout.batches_to_end(0)


def test_restored_at_every_batch_continues_as_the_read_batch_path(files, monkeypatch):
    """From the state after each batch (mid-window, at a window's and at the epoch's end)
    the rest of the stream is the produced path's."""
    common.assert_restores_at_every_batch(
        monkeypatch, lambda: _loader(files, chunk=3, window=2, batch=4, metadata=True))


def test_rest_of_epoch_and_describe(files):
    """``dataset(rest_of_epoch=True)`` ends at the epoch's end; describe() names the path."""
    loader = _loader(files, chunk=3, window=2, batch=4)
    whole = [_values(b) for b in loader.dataset()]
    per_epoch = loader.plan.layout.batches_per_epoch

    assert [_values(b) for b in loader.dataset(rest_of_epoch=True)] == whole[:per_epoch]
    text = loader.describe()
    assert "tfrecord_graph path" in text
    assert "TFRecordDatasetV2" in text


@pytest.mark.parametrize("stages", [False, True], ids=["plain", "tf_map"])
def test_for_batch_in_loader_gives_the_same_batches(files, stages):
    """The eager loop (its own path without tensor stages, this dataset with them) gives
    the dataset's batches and positions."""
    loader = _loader(files, chunk=3, window=2, batch=4, stages=stages)
    expected = [_values(b) for b in loader.dataset()]

    assert [_values(b) for b in loader] == expected
    assert loader.get_state() != _loader(files, chunk=3, window=2, batch=4).get_state()


@pytest.mark.parametrize(("name", "record", "window"), [
    ("part-3.tfrecord", 4, 2),  # record 26 of 41, mid-run
    ("part-0.tfrecord", 0, 1),  # the first record of a window of one chunk: none read
])
def test_corrupt_record_raises_the_sources_error_naming_file_record_offset(
        files, name, record, window):
    """TensorFlow's DataLossError names no file: the window is read again by the source,
    whose error names the file, the record and its byte offset."""
    path = files / name
    offset = common.flip(path, record)
    loader = _loader(files, chunk=4, window=window, batch=5)
    assert _path(loader) == "tfrecord_graph"

    message = common.dataset_error(loader)
    assert f"{path}, record {record} (byte offset {offset})" in message
    assert "fails its CRC32C checksum" in message


def test_file_changed_after_the_source_was_built_refused(files):
    """A file rewritten after it was indexed (same records, so TensorFlow reads it well)
    is refused when its window is read, as the source refuses it."""
    loader = _loader(files, chunk=4, window=2, batch=5)
    path = files / "part-0.tfrecord"
    data = path.read_bytes()
    path.write_bytes(data)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    with pytest.raises(tf.errors.OpError, match="changed since it was indexed"):
        list(loader.dataset())


@pytest.mark.parametrize("change", [
    "verify_checksums=False", "thread workers", "shard 0 of 2", "on_error skip", "map",
    "mixed with itself",
])
def test_declined_where_it_would_not_be_exact(files, change):
    """Checksums off (TensorFlow's reader checks them), workers, a shard, a bad-record
    policy that replaces, a record stage, a mixture: another path."""
    source = TFRecordSource(str(files / "part-*.tfrecord"), index_dir=str(files / "index"),
                            verify_checksums=change != "verify_checksums=False")
    pipeline = Pipeline(source, seed=7)
    if change == "mixed with itself":
        pipeline = Pipeline.mix({"a": source, "b": source}, weights={"a": 1, "b": 1}, seed=7)
    else:
        pipeline = pipeline.shuffle(chunk_records=4, window_chunks=2)
    if change == "on_error skip":
        pipeline = pipeline.on_error("skip", quarantine=str(files / "quarantine.jsonl"))
    if change == "map":
        pipeline = pipeline.map(lambda record, rng: record)
    options = {"workers": Workers(2, kind="thread")} if change == "thread workers" else {}
    shard = Shard(0, 2) if change == "shard 0 of 2" else None
    loader = ResumableLoader.from_pipeline(pipeline.batch(5), num_epochs=1, shard=shard,
                                           **options)

    assert "tfrecord_graph" not in loader.describe()


def test_distributed_input_of_such_a_loader_splits_the_same_batches(files):
    """tf.distribute input (`input_context`) makes its per-pipeline batches in Python, as
    for every loader: each step's records together are this path's batch's."""
    loader = _loader(files, chunk=4, window=2, batch=4, drop=True, metadata=True)
    whole = [meta["index"].numpy().tolist() for _, meta in loader.dataset()]
    streams = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(2, pipeline_id, 2)
        streams.append([meta["index"].numpy().tolist()
                        for _, meta in loader.dataset(input_context=context)])

    assert _path(loader) == "tfrecord_graph"
    assert [sorted(a + b) for a, b in zip(*streams, strict=True)] == [sorted(b) for b in whole]


def test_stats_after_a_dataset_epoch(files):
    """``loader.stats()`` reads this path's loader (its tensor stage counted in tf.data)."""
    loader = _loader(files, chunk=4, window=2, batch=5, epochs=1, stages=True)
    batches = list(loader.dataset())

    stats = loader.stats()
    assert len(batches) == 9
    assert "tf_map" in str(stats)


def test_advance_in_tf_function_resumes_in_a_fresh_loader(files):
    """Batches pulled and advanced inside a tf.function (as Keras does), saved, restored
    into a fresh loader: it continues with the next batch, mid-window."""
    make = lambda: _loader(files, chunk=3, window=2, batch=4, epochs=None)  # noqa: E731
    loader = make()
    iterator = iter(loader.dataset())

    @tf.function
    def step():
        batch = next(iterator)
        loader.advance(after=batch)
        return batch

    for _ in range(13):  # past an epoch (11 batches)
        step()
    fresh = make()
    fresh.set_state(loader.get_state())
    following = next(iter(fresh.dataset())).numpy().tolist()
    assert following == step().numpy().tolist()
    uninterrupted = iter(make().dataset())
    assert following == [next(uninterrupted) for _ in range(14)][-1].numpy().tolist()


def test_two_iterations_read_at_once_fail_within_a_window(files):
    """zip(ds, ds) fails the step with the ledger's message within the windows already made
    ahead."""
    loader = _loader(files, chunk=3, window=2, batch=4, prefetch=None)
    ds = loader.dataset()
    pairs = 0
    with pytest.raises(tf.errors.OpError, match="Two iterations of this loader") as info:
        for _ in tf.data.Dataset.zip((ds, ds)):
            pairs += 1
            loader.advance()
    assert "StreamIntegrityError" in str(info.value)
    # Within the windows made ahead (read ahead, and batched as far ahead as tf.data's
    # parallel map runs: a few windows of 6 records), long before the stream's 22 batches.
    assert pairs <= loader.plan.layout.batches_per_epoch


@pytest.mark.parametrize("drop", [False, True], ids=["short-last-batch", "drop-remainder"])
def test_a_state_of_another_batch_size_continues_as_the_read_batch_path(files, monkeypatch,
                                                                         drop):
    """A state saved with batches of 5 (elastic resume) restored into batches of 4 at
    positions that are no batch boundary of 4: batches begin there (and straddle
    windows) up to the epoch's end, as on the read_batch path, not at the epoch's
    boundaries of 4 (which would hand out consumed records again)."""
    make = lambda: _loader(files, chunk=3, window=2, batch=4, drop=drop,  # noqa: E731
                           metadata=True)
    saved = _loader(files, chunk=3, window=2, batch=5).get_state()
    common.assert_restores_at_offsets(monkeypatch, make, saved,
                                      (1, 5, 6, 13, 35, 38, 39, 40, 41 + 6), 41)
