"""The ``tfrecord_graph`` path in the global shuffle (and the natural order) of local
TFRecord files: each window of positions spooled into a memfd file by runs, read by
TensorFlow's reader. Its batches are the ``read_batch`` path's byte for byte from any
position, across windows and epochs; a corrupt record or a changed file raises the
``read_batch`` path's error, word for word."""

from __future__ import annotations

import os
import re

import _tfrecord_graph as common
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader
from resumeloader.sources import TFRecordSource
from resumeloader.tfdata import tfrecord_graph

_CUTS, _RECORDS = common.CUTS, common.RECORDS
_path, _values, _produced = common.path, common.values, common.produced


@pytest.fixture
def files(tmp_path):
    return common.write_files(tmp_path)


def _loader(folder, monkeypatch, *, window=1, batch=5, drop=False, epochs=2, metadata=False,
            stages=False, shuffle=True, **options) -> ResumableLoader:
    """The files in the global shuffle (the natural order unless `shuffle`), batches of
    `batch`, windows of `window` batches (0: one window an epoch)."""
    source = TFRecordSource(str(folder / "part-*.tfrecord"), index_dir=str(folder / "index"))
    pipeline = Pipeline(source, seed=7)
    if shuffle:
        pipeline = pipeline.shuffle()
    pipeline = pipeline.batch(batch, drop_remainder=drop)
    if stages:
        pipeline = pipeline.tf_map(common.lengths)
    # Windows of `window` batches: the path reads WINDOW_BYTES when it is built.
    size = tfrecord_graph.WINDOW_BYTES
    if window:
        size = int(source.mean_record_bytes() * batch * (window + 0.5))
    with monkeypatch.context() as patch:
        patch.setattr(tfrecord_graph, "WINDOW_BYTES", size)
        return ResumableLoader.from_pipeline(pipeline, num_epochs=epochs,
                                             with_metadata=metadata, **options)


_SHAPES = {
    "windows-of-one-batch": {"window": 1, "batch": 5},
    "windows-of-two-batches-drop-remainder-metadata": {"window": 2, "batch": 4, "drop": True,
                                                       "metadata": True},
    "windows-of-three-batches-tf_map-three-epochs": {"window": 3, "batch": 3, "epochs": 3,
                                                     "stages": True},
    "one-window-an-epoch-metadata": {"window": 0, "batch": 6, "metadata": True},
    "batch-of-one": {"window": 2, "batch": 1, "epochs": 1},
    "natural-order": {"window": 2, "batch": 4, "shuffle": False, "metadata": True},
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_batches_are_the_read_batch_paths_byte_for_byte(files, monkeypatch, shape):
    """Every batch (its bytes, metadata, tensor stages' output) over several epochs is
    the read_batch path's, whatever the windows and batches."""
    kwargs = _SHAPES[shape]
    graph_loader = _loader(files, monkeypatch, **kwargs)
    produced = _produced(monkeypatch, lambda: _loader(files, monkeypatch, **kwargs))

    assert _path(graph_loader) == "tfrecord_graph"
    expected = [_values(b) for b in produced.dataset()]
    assert [_values(b) for b in graph_loader.dataset()] == expected
    assert len(expected) == graph_loader.plan.layout.batches_to_end(0)


@pytest.mark.parametrize("window", [1, 3])
def test_restored_at_every_batch_continues_as_the_read_batch_path(files, monkeypatch, window):
    """From the state after each batch (mid-window, at a window's and at the epoch's end)
    the rest of the stream is the read_batch path's."""
    make = lambda: _loader(files, monkeypatch, window=window, batch=4,  # noqa: E731
                           metadata=True)
    common.assert_restores_at_every_batch(monkeypatch, make)


def test_rest_of_epoch_describe_and_spool_slots_given_back(files, monkeypatch):
    """``dataset(rest_of_epoch=True)`` ends at the epoch's end; describe() names the path
    and how it reads; every spool slot a window took is given back."""
    loader = _loader(files, monkeypatch, window=2, batch=4)
    whole = [_values(b) for b in loader.dataset()]
    per_epoch = loader.plan.layout.batches_per_epoch

    assert [_values(b) for b in loader.dataset(rest_of_epoch=True)] == whole[:per_epoch]
    text = " ".join(loader.describe().split())
    assert "tfrecord_graph path" in text
    assert "memfd" in text
    assert "TFRecordDatasetV2" in text
    assert loader._delivery._spool.slots()[1] == 0


@pytest.mark.parametrize("stages", [False, True], ids=["plain", "tf_map"])
def test_for_batch_in_loader_gives_the_same_batches(files, monkeypatch, stages):
    """The eager loop (its own path without tensor stages, this dataset with them) gives
    the dataset's batches and positions."""
    loader = _loader(files, monkeypatch, window=2, batch=4, stages=stages)
    expected = [_values(b) for b in loader.dataset()]

    assert [_values(b) for b in loader] == expected


def _error(loader: ResumableLoader) -> str:
    """The RecordError that reading `loader`'s dataset raises, as tf.data reports it
    (the message of the Python exception, without TensorFlow's traceback)."""
    with pytest.raises(tf.errors.OpError) as info:
        list(loader.dataset())
    found = re.search(r"RecordError: .*", str(info.value))
    assert found is not None, str(info.value)
    return found.group(0)


@pytest.mark.parametrize(("name", "record", "window"), [
    ("part-3.tfrecord", 4, 1),  # record 26 of 41
    ("part-0.tfrecord", 1, 3),
    ("part-2.tfrecord", 12, 0),  # one window an epoch
])
def test_corrupt_record_raises_the_read_batch_paths_error(files, monkeypatch, name, record,
                                                          window):
    """TensorFlow's DataLossError names no file: the window is read again batch by batch
    as the read_batch path reads it, which raises that path's error (the batch, epoch and
    position, the file, the record and its byte offset)."""
    path = files / name
    offset = common.flip(path, record)
    make = lambda: _loader(files, monkeypatch, window=window, batch=4)  # noqa: E731
    loader = make()
    assert _path(loader) == "tfrecord_graph"

    message = _error(loader)
    assert f"{path}, record {record} (byte offset {offset})" in message
    assert "fails its CRC32C checksum" in message
    assert message == _error(_produced(monkeypatch, make))


def test_restored_past_a_corrupt_record_of_its_window_reads_on(files, monkeypatch):
    """A restore inside a window reads only the window's positions from there: a corrupt
    record before them (in the first batch of the window) is not read, as on the
    read_batch path."""
    make = lambda: _loader(files, monkeypatch, window=3, batch=4, epochs=1)  # noqa: E731
    first = make().plan.indices(0, 0, 4).tolist()
    record = next(r for r in first if r % 6)  # a record with data
    number = next(n for n in range(4) if _CUTS[n] <= record < _CUTS[n + 1])
    common.flip(files / f"part-{number}.tfrecord", record - _CUTS[number])
    loader, produced = make(), _produced(monkeypatch, make)  # (the file indexed anew)
    state = dict(loader.get_state(), offset=4)
    loader.set_state(state)
    produced.set_state(state)

    expected = [_values(b) for b in produced.dataset()]
    assert [_values(b) for b in loader.dataset()] == expected
    assert len(expected) == 11 - 1  # 41 records, batches of 4


def test_file_changed_after_the_source_was_built_refused(files, monkeypatch):
    """A file rewritten after it was indexed (same records) is refused when a window
    reads it, with the read_batch path's error."""
    make = lambda: _loader(files, monkeypatch, window=2, batch=5)  # noqa: E731
    loader, produced = make(), _produced(monkeypatch, make)
    path = files / "part-0.tfrecord"
    path.write_bytes(path.read_bytes())
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    message = _error(loader)
    assert "changed since it was indexed" in message
    assert message == _error(produced)


def test_declined_for_objects_and_unchecked_files(files, monkeypatch):
    """Checksums off (TensorFlow's reader checks them): the read_batch path."""
    source = TFRecordSource(str(files / "part-*.tfrecord"), index_dir=str(files / "index"),
                            verify_checksums=False)
    loader = ResumableLoader.from_pipeline(Pipeline(source, seed=7).shuffle().batch(5))

    assert _path(loader) == "read_batch"


@pytest.mark.parametrize("drop", [False, True], ids=["short-last-batch", "drop-remainder"])
def test_a_state_of_another_batch_size_continues_as_the_read_batch_path(files, monkeypatch,
                                                                         drop):
    """A state saved with batches of 5 (elastic resume) restored into batches of 4 over
    windows of 2 batches, at positions that are no batch boundary of 4 (batches then
    begin there, and straddle windows, up to the epoch's end): the stream is the
    read_batch path's."""
    make = lambda: _loader(files, monkeypatch, window=2, batch=4, drop=drop,  # noqa: E731
                           metadata=True)
    saved = _loader(files, monkeypatch, window=2, batch=5).get_state()
    common.assert_restores_at_offsets(monkeypatch, make, saved,
                                      (1, 6, 10, 13, 35, 38, 39, 40, 41 + 6), 41)


def test_a_corrupt_record_after_a_restore_of_another_batch_size_raises_the_same_error(
        files, monkeypatch):
    """Batches cut from a position of another batch size: the window read again batch by
    batch names the batch the read_batch path names."""
    make = lambda: _loader(files, monkeypatch, window=2, batch=4, epochs=1)  # noqa: E731
    record = next(r for r in make().plan.indices(0, 14, 18).tolist() if r % 6)
    number = next(n for n in range(4) if _CUTS[n] <= record < _CUTS[n + 1])
    common.flip(files / f"part-{number}.tfrecord", record - _CUTS[number])
    loader, produced = make(), _produced(monkeypatch, make)
    saved = _loader(files, monkeypatch, window=2, batch=5, epochs=1).get_state()
    state = dict(saved, offset=6)  # batches of 4 from 6: [6, 10), [10, 14), [14, 18), ...
    loader.set_state(state)
    produced.set_state(state)

    message = _error(loader)
    assert "fails its CRC32C checksum" in message
    assert "position 14" in message
    assert message == _error(produced)
