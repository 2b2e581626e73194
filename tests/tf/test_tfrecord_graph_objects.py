"""The ``tfrecord_graph`` path over objects: each window's blocks from the span cache,
spooled into a memfd file that TensorFlow's reader reads. Its batches are the
``read_batch`` path's byte for byte over the same objects, from any position and through
the proxy's faults; a corrupt record or a changed object raises the source's error naming
the object; its spool files are bounded however many iterations are dropped.

The server is moto's S3 server behind a `FaultProxy` (`_objstore_fixtures`)."""

from __future__ import annotations

import gc

import _objstore
import _tfrecord_graph as common
import pytest
from _objstore_fixtures import records

from resumeloader import Pipeline, ResumableLoader, Workers
from resumeloader.sources import TFRecordSource
from resumeloader.sources.storage import fetch
from resumeloader.tfdata import tfrecord_graph

_CUTS, _RECORDS = common.CUTS, common.RECORDS
_lengths, _path, _values, _produced = common.lengths, common.path, common.values, common.produced


def _objects(store, records_of=None):
    """The four objects in a fresh folder; their glob URL and each object's key."""
    folder = store.folder()
    keys = []
    for number in range(4):
        part = _RECORDS[_CUTS[number] : _CUTS[number + 1]]
        if records_of is not None:
            part = records_of(number, part)
        keys.append(f"{folder}/part-{number}.tfrecord")
        store.put(keys[-1], _objstore.tfrecord_bytes(part))
    return store.url(f"{folder}/part-*.tfrecord"), keys


@pytest.fixture
def url(s3_store):
    return _objects(s3_store)[0]


def _source(store, url, tmp_path, **kwargs):
    return TFRecordSource(url, index_dir=str(tmp_path / "index"), storage=store.storage(),
                          **kwargs)


def _loader(store, url, tmp_path, **kwargs) -> ResumableLoader:
    return common.loader(_source(store, url, tmp_path), **kwargs)


_SHAPES = {
    "batches-straddle-windows-metadata": {"chunk": 4, "window": 2, "batch": 5,
                                          "metadata": True},
    "drop-remainder": {"chunk": 4, "window": 2, "batch": 5, "drop": True},
    "batch-over-three-windows-tf_map": {"chunk": 2, "window": 1, "batch": 5, "stages": True,
                                        "metadata": True},
    "chunks-over-object-ends-windows-of-three": {"chunk": 10, "window": 3, "batch": 4,
                                                 "epochs": 3},
    "one-window-an-epoch": {"chunk": 41, "window": 1, "batch": 41, "metadata": True},
}


@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_batches_are_the_read_batch_paths_byte_for_byte(s3_store, url, tmp_path, monkeypatch,
                                                        shape):
    """Every batch (bytes, metadata, tensor stages' output) over several epochs is the
    read_batch path's over the same objects; describe() says the chunks are spooled."""
    kwargs = _SHAPES[shape]
    loader = _loader(s3_store, url, tmp_path, **kwargs)
    produced = _produced(monkeypatch, lambda: _loader(s3_store, url, tmp_path, **kwargs))

    assert _path(loader) == "tfrecord_graph"
    assert "spooled from the object store" in loader._delivery.source_row()[1]
    assert "memfd" in loader.describe()
    expected = [_values(b) for b in produced.dataset()]
    assert [_values(b) for b in loader.dataset()] == expected
    assert len(expected) == loader.plan.layout.batches_to_end(0)


def test_restored_at_every_batch_continues_as_the_read_batch_path(s3_store, url, tmp_path,
                                                                  monkeypatch):
    """From the state after each batch (mid-window, at a window's end, at an epoch's end)
    the rest of the stream is the read_batch path's."""
    make = lambda: _loader(s3_store, url, tmp_path, chunk=3, window=2, batch=4,  # noqa: E731
                           metadata=True)
    common.assert_restores_at_every_batch(monkeypatch, make)


def test_for_batch_in_loader_with_a_tensor_stage_reads_this_dataset(s3_store, url, tmp_path):
    """With a tensor stage the eager loop reads this path's dataset: the same batches."""
    loader = _loader(s3_store, url, tmp_path, chunk=3, window=2, batch=4, stages=True)
    expected = [_values(b) for b in loader.dataset()]

    assert [_values(b) for b in loader] == expected


@pytest.mark.parametrize("fault", ["503", "reset"])
def test_faults_through_the_proxy_give_the_same_batches(s3_store, url, tmp_path, fault):
    """GETs failing with 503s or resets are retried: the same bytes, every batch."""
    expected = [_values(b) for b in _loader(s3_store, url, tmp_path).dataset()]
    loader = _loader(s3_store, url, tmp_path)
    with s3_store.faults(fault, 4) as proxy:
        got = [_values(b) for b in loader.dataset()]
        assert proxy.faulted[fault] == 4
    assert got == expected


def _corrupt(data: bytes, record: int) -> tuple[bytes, int]:
    """`data` (a TFRecord file's bytes) with a data byte of `record` flipped; and the
    record's byte offset."""
    data = bytearray(data)
    offset = 0
    for _ in range(record):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    data[offset + 12 + 2] ^= 0x01
    return bytes(data), offset


@pytest.mark.parametrize(("part", "record", "window"), [
    (3, 4, 2),  # record 26 of 41, mid-window
    (0, 0, 1),  # the first record of a window of one chunk: none read
])
def test_corrupt_record_raises_the_sources_error_naming_object_record_offset(
        s3_store, tmp_path, part, record, window):
    """A record whose bytes are flipped on the server: TensorFlow's reader stops short,
    the window is read again by the source, whose error names the object, the record and
    its byte offset (not TensorFlow's DataLossError)."""
    url, keys = _objects(s3_store)
    data, offset = _corrupt(
        _objstore.tfrecord_bytes(_RECORDS[_CUTS[part] : _CUTS[part + 1]]), record)
    s3_store.put(keys[part], data)
    loader = _loader(s3_store, url, tmp_path, chunk=4, window=window, batch=5)
    assert _path(loader) == "tfrecord_graph"

    message = common.dataset_error(loader)
    assert f"{s3_store.url(keys[part])}, record {record} (byte offset {offset})" in message
    assert "fails its CRC32C checksum" in message


def test_object_changed_after_the_source_was_built_is_refused(s3_store, tmp_path):
    """An object rewritten after the source was built (the same sizes, other records) is
    refused by the fetch layer's version check, named as the read_batch path names it."""
    url, keys = _objects(s3_store)
    loader = _loader(s3_store, url, tmp_path, chunk=4, window=2, batch=5)
    s3_store.put(keys[2], _objstore.tfrecord_bytes(_RECORDS[9:22][::-1]))
    fetch.clear()

    message = common.dataset_error(loader)
    assert f"{s3_store.url(keys[2]).split('://')[1]}" in message
    assert "changed since the source was built" in message


def test_dropped_iterations_leave_the_spool_bounded(s3_store, url, tmp_path, monkeypatch):
    """Iterations dropped mid-epoch (their windows placed, never checked) hold at most
    `SPOOL_SLOTS` spool files; the next full read is still the read_batch path's."""
    loader = _loader(s3_store, url, tmp_path, chunk=3, window=2, batch=4, epochs=None)
    spool = loader._delivery._spool
    peak = 0
    for _ in range(3 * tfrecord_graph.SPOOL_SLOTS):
        iterator = iter(loader.dataset())
        next(iterator)
        next(iterator)
        del iterator
        gc.collect()
        assert spool.slots()[0] <= tfrecord_graph.SPOOL_SLOTS
        peak = max(peak, spool.slots()[1])
    assert peak >= 2  # dropped iterations did leave windows placed and never checked

    make = lambda: _loader(s3_store, url, tmp_path, chunk=3, window=2, batch=4)  # noqa: E731
    expected = [_values(b) for b in _produced(monkeypatch, make).dataset()]
    fresh = make()
    assert [_values(b) for b in fresh.dataset()] == expected
    opened, taken = fresh._delivery._spool.slots()
    assert (opened, taken) == (1, 0)  # one slot, reused by every window, given back


def test_spool_reclaims_the_oldest_taken_slot_and_refuses_its_check():
    """Past the limit the oldest taken slot is reclaimed (no new file); the window that
    held it cannot give it back, so its check refuses what its reader read."""
    spool = tfrecord_graph.Spool(limit=3)
    taken = [spool.take() for _ in range(3)]
    again = spool.take()

    assert spool.slots() == (3, 3)
    assert again[0] == taken[0][0] and again[1] != taken[0][1]  # the oldest, a new token
    assert not spool.give_back(*taken[0][:2])
    assert spool.give_back(*again[:2]) and spool.give_back(*taken[1][:2])
    assert spool.slots() == (3, 1)
    assert spool.path(again[0]) == b"/proc/self/fd/%d" % again[2]
    spool.close()
    assert spool.slots()[0] == 0


@pytest.mark.parametrize("change", [
    "local and objects mixed", "verify_checksums=False", "Workers(1)", "no memfd",
    "window too big to hold",
])
def test_declined_where_it_cannot_spool(s3_store, url, tmp_path, monkeypatch, change):
    """Local files mixed with objects, checksums off, workers, no memfd files, windows past
    the held-bytes budget: the read_batch path."""
    source = _source(s3_store, url, tmp_path,
                     verify_checksums=change != "verify_checksums=False")
    if change == "local and objects mixed":
        local = tmp_path / "local.tfrecord"
        local.write_bytes(_objstore.tfrecord_bytes(records(0, 5)))
        source = TFRecordSource([url, str(local)], index_dir=str(tmp_path / "index"),
                                storage=s3_store.storage())
    if change == "no memfd":
        monkeypatch.setattr(tfrecord_graph.Spool, "available", staticmethod(lambda: False))
    if change == "window too big to hold":
        monkeypatch.setattr("resumeloader.sources.tfrecord.HELD_BYTES", 100)
    pipeline = Pipeline(source, seed=7).shuffle(chunk_records=4, window_chunks=2).batch(5)
    options = {"workers": Workers(1)} if change == "Workers(1)" else {}
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1, **options)

    assert _path(loader) == "read_batch"


def test_placing_a_window_starts_the_next_windows_gets(s3_store, url, tmp_path):
    """Placing a window announces the next one's blocks (`TFRecordSource.prefetch`): their
    bytes are on their way, read ahead and not yet used, before the next is placed; the
    last window announces nothing."""
    loader = _loader(s3_store, url, tmp_path, chunk=10, window=1, batch=10, epochs=1)
    path = loader._delivery
    windows = path.chunks(0, rest_of_epoch=False)
    fetch.clear()

    path.window_at(0, 0, 0, windows)
    assert fetch.ahead_bytes() > 0
    fetch.clear()
    path.window_at(0, windows - 1, 0, windows)
    assert fetch.ahead_bytes() == 0


def test_conformance_suite_covers_both_paths_over_s3(s3_store):
    """The resume-conformance entries over S3 take this path and the read_batch path."""
    import _conformance

    taken = {name: _path(_conformance.REGISTRY[name].make()) for name in (
        "tfrecord-s3-block-order-tf_map", "tfrecord-s3-block-order-read_batch-workers1")}
    assert taken == {"tfrecord-s3-block-order-tf_map": "tfrecord_graph",
                     "tfrecord-s3-block-order-read_batch-workers1": "read_batch"}
