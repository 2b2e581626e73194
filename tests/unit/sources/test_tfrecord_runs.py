"""TFRecord batches read as runs (`TFRecordSource.read_packed`): one read per run of
neighbouring records into one recycled buffer, the framing checked with array
operations, a corrupt record still named; local files and objects (moto's S3 server
behind the fault proxy), no TensorFlow."""

from __future__ import annotations

import dataclasses
import os

import _objstore
import numpy as np
import pytest
from _objstore_fixtures import FAST, packed_strings, put_tfrecords, records, source, tfrecord_files

from resumeloader import Pipeline
from resumeloader.core import buffers
from resumeloader.sources import CorruptRecordError, TFRecordSource
from resumeloader.sources.storage import fetch, handles
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce


@pytest.fixture
def local(tmp_path):
    paths, every = tfrecord_files(str(tmp_path))
    return TFRecordSource(paths, index_dir=tmp_path / "index"), every, paths


def test_packed_batches_are_read_batch_in_any_order(local):
    """Shuffled, consecutive, repeated, across files and empty: the same records."""
    src, every, _ = local
    rng = np.random.default_rng(0)
    batches = [rng.permutation(len(every))[:40], np.arange(30, 90), rng.permutation(70)[::-1],
               np.array([5, 5, 149, 0, 5]), np.array([], dtype=np.int64)]
    for indices in batches:
        column = src.read_packed(indices)
        assert column[:8].view(np.int64)[0] == 1 + 2 * len(indices)  # the packed variant
        assert packed_strings(column) == [every[i] for i in indices] == src.read_batch(indices)
    with pytest.raises(IndexError, match="must lie in"):
        src.read_packed(np.array([0, len(every)]))


def test_neighbouring_records_are_read_by_one_pread_per_run(local):
    """Consecutive records of one file: one pread; two far parts of two files: one each;
    the order within the batch does not matter."""
    src, every, _ = local
    cases = [(np.arange(10, 40), 1), (np.arange(10, 40)[::-1], 1),
             (np.concatenate([np.arange(0, 8), np.arange(120, 130)]), 2),
             (np.array([0, 110, 1, 111, 2]), 2)]
    for indices, preads in cases:
        before = handles.stats()["reads"]
        assert packed_strings(src.read_packed(indices)) == [every[i] for i in indices]
        assert handles.stats()["reads"] - before == preads, indices


def test_a_batch_over_many_files_reads_each_file_once_and_releases_it(tmp_path):
    """12 files, shuffled batches touching most of them: the records of read_batch, one
    pread per run, every descriptor released after the batch; the indexes view one array
    of all the records' offsets (no second copy)."""
    paths, every = tfrecord_files(str(tmp_path), count=12, per_file=20, size=50)
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    rng = np.random.default_rng(1)
    for _ in range(5):
        indices = rng.permutation(len(every))[:64]
        before = handles.stats()["reads"]
        assert packed_strings(src.read_packed(indices)) == [every[i] for i in indices]
        assert 12 <= handles.stats()["reads"] - before <= 64
        assert all(entry.users == 0 for entry in handles.CACHE._entries.values())
    offsets = [ix.offsets for ix in src._indexes]
    assert all(view.base is offsets[0].base for view in offsets)
    assert sum(map(len, offsets)) == len(offsets[0].base) == len(every)


def test_a_changed_file_among_many_is_named_and_its_descriptor_released(tmp_path):
    """One file of 12 rewritten (another size) after the source was built: a batch over all
    of them raises naming that file, and leaves no descriptor in use."""
    paths, every = tfrecord_files(str(tmp_path), count=12, per_file=20, size=50)
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    assert packed_strings(src.read_packed(np.arange(0, 240, 7))) == every[0:240:7]
    with open(paths[5], "ab") as out:
        out.write(b"more")
    with pytest.raises(CorruptRecordError, match=r"part-5\.tfrecord changed") as info:
        src.read_packed(np.arange(0, 240, 7))
    assert info.value.record_index == 105  # the batch's first record of that file
    assert all(entry.users == 0 for entry in handles.CACHE._entries.values())


def _corrupt(path: str, offset: int) -> None:
    stat = os.stat(path)
    with open(path, "r+b") as out:
        out.seek(offset)
        byte = out.read(1)
        out.seek(offset)
        out.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same stamp: only the CRC sees it


@pytest.mark.parametrize("where", ["data", "length", "length-crc", "data-crc"])
def test_a_corrupt_record_inside_a_run_is_named_by_file_and_offset(tmp_path, where):
    """A flipped byte of record 7 of file 1, read in a run of its neighbours: the error
    names the file, the record's number and byte offset; a batch without it reads."""
    paths, every = tfrecord_files(str(tmp_path))
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    first = records(1, 50, 207)
    offset = sum(16 + len(r) for r in first[:7])
    at = {"data": 12 + 3, "length": 2, "length-crc": 9, "data-crc": 16 + len(first[7]) - 2}
    _corrupt(paths[1], offset + at[where])
    with pytest.raises(CorruptRecordError) as info:
        src.read_packed(np.arange(50, 70))
    message = str(info.value)
    assert "part-1.tfrecord, record 7" in message and f"byte offset {offset}" in message
    assert info.value.record_index == 57
    assert packed_strings(src.read_packed(np.arange(58, 80))) == every[58:80]
    if where == "data":  # without checksums only the framing is checked
        unchecked = TFRecordSource(paths, index_dir=tmp_path / "index", verify_checksums=False)
        assert packed_strings(unchecked.read_packed(np.arange(56, 59)))[0] == every[56]


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    """A file cut short after it was indexed: CorruptRecordError naming it, no short record."""
    paths, _ = tfrecord_files(str(tmp_path))
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    size = os.path.getsize(paths[2])
    with open(paths[2], "r+b") as out:
        out.truncate(size - 100)
    with pytest.raises(CorruptRecordError, match=r"part-2\.tfrecord"):
        src.read_packed(np.arange(120, 150))


def _framed(data: bytes) -> list[bytes]:
    """The records of a TFRecord file's bytes (framing not checked: the source did)."""
    out, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at : at + 8], "little")
        out.append(data[at + 12 : at + 12 + length])
        at += 16 + length
    return out


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd files (Linux)")
def test_spooled_ranges_are_the_records_framed_one_after_the_other(local):
    """`spool_local` writes the records of its ranges (runs of neighbours in one file,
    one pread each), framing included, from byte 0 of the file: a TFRecord file of
    them; a buffer too small grows, one large enough is reused; no ranges write
    nothing."""
    src, every, _ = local
    firsts, lasts = np.array([0, 7, 49, 50, 120]), np.array([3, 8, 50, 60, 150])
    fd = os.memfd_create("spool")
    try:
        before = handles.stats()["reads"]
        written, buffer = src.spool_local(firsts, lasts, fd, np.empty(10, np.uint8))
        assert handles.stats()["reads"] - before == len(firsts)
        data = os.pread(fd, written + 100, 0)
        wanted = [every[i] for a, b in zip(firsts, lasts, strict=True) for i in range(a, b)]
        assert len(data) == written
        assert _framed(data) == wanted
        again, same = src.spool_local(firsts[:2], lasts[:2], fd, buffer)
        assert same is buffer
        assert _framed(os.pread(fd, again, 0)) == wanted[:4]
        assert src.spool_local(firsts[:0], lasts[:0], fd, buffer)[0] == 0
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd files (Linux)")
def test_spooling_a_file_changed_since_it_was_indexed_is_refused(tmp_path):
    """A file cut short since it was indexed: StaleFileError naming it (its stamp
    changed), nothing handed on as records."""
    paths, _ = tfrecord_files(str(tmp_path))
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    with open(paths[1], "r+b") as out:
        out.truncate(os.path.getsize(paths[1]) - 100)
    fd = os.memfd_create("spool")
    try:
        with pytest.raises(handles.StaleFileError, match=r"part-1\.tfrecord"):
            src.spool_local(np.array([60]), np.array([100]), fd)
    finally:
        os.close(fd)


def test_a_kept_batch_stays_right_while_its_buffer_would_be_reused(tmp_path):
    """The recycled buffers never alias a batch still held: 30 later batches of the same
    size, from the pool (records large enough for pooled memory), leave the first one's
    records as they were."""
    paths, every = tfrecord_files(str(tmp_path), size=2000)
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    first = np.arange(20, 70)
    kept = src.read_packed(first)
    assert kept.nbytes >= buffers.MIN_BYTES  # a batch of pooled memory
    view = kept[100:]  # a view keeps the buffer too
    copy = view.copy()
    reused = buffers.POOL.reused
    for start in range(30):
        indices = np.arange(start, start + 50) % len(every)
        assert packed_strings(src.read_packed(indices[::-1]))[-1] == every[indices[0]]
    assert buffers.POOL.reused > reused  # later batches did recycle buffers
    assert packed_strings(kept) == [every[i] for i in first]
    assert (view == copy).all()


def test_the_loader_producer_hands_the_packed_column_over(local):
    """A pipeline of the source's records, batched: each batch is the packed column,
    the same records in the same order as `read_batch` of the batch's indices."""
    src, every, _ = local
    plan = Plan(Pipeline(src, seed=3).shuffle().batch(16), num_epochs=1)
    producer = produce.BatchProducer(plan.pipeline)
    for task in plan.tasks(0, plan.layout):
        (column,) = producer.batch(task).batches
        assert column[:8].view(np.int64)[0] == 1 + 2 * len(task.indices)
        assert packed_strings(column) == [every[i] for i in task.indices]


def test_a_skip_policy_replaces_a_corrupt_record_read_in_a_run(tmp_path):
    """on_error("skip"): the batch holding a corrupt record is read again record by
    record and the record replaced; "raise" names it."""
    paths, every = tfrecord_files(str(tmp_path))
    _corrupt(paths[0], sum(16 + len(r) for r in records(0, 50, 200)[:3]) + 20)
    src = TFRecordSource(paths, index_dir=tmp_path / "index")
    pipeline = Pipeline(src, seed=0).batch(10)
    skipping = pipeline.on_error("skip", max_fraction=0.5, quarantine=tmp_path / "q.jsonl")
    plan = Plan(skipping, num_epochs=1)
    producer = produce.BatchProducer(plan.pipeline)
    task = next(iter(plan.tasks(0, plan.layout)))
    (column,) = producer.batch(task).batches
    got = packed_strings(column)
    assert got[:3] == every[:3] and got[4:] == every[4:10] and got[3] != every[3]
    assert got[3] in every
    raising = produce.BatchProducer(Plan(pipeline, num_epochs=1).pipeline)
    with pytest.raises(Exception, match=r"part-0\.tfrecord, record 3"):
        raising.batch(task)


def test_objects_are_read_by_runs_through_the_proxy(s3_store, tmp_path):
    """Objects behind the fault proxy: the same records; consecutive records cost one
    GET per object touched; a corrupt record is named."""
    url, every = put_tfrecords(s3_store, files=3, count=40)
    src = source(s3_store, url, tmp_path)
    fetch.clear()
    s3_store.proxy.clear()
    indices = np.arange(30, 50)[::-1]
    assert packed_strings(src.read_packed(indices)) == [every[i] for i in indices]
    assert s3_store.proxy.reads <= 2
    shuffled = np.random.default_rng(2).permutation(len(every))[:50]
    assert packed_strings(src.read_packed(shuffled)) == [every[i] for i in shuffled]
    folder = s3_store.folder()
    written = records(0, 10)
    data = bytearray(_objstore.tfrecord_bytes(written))
    record_4 = sum(16 + len(r) for r in written[:4])
    data[record_4 + 12 + 5] ^= 0xFF
    bad = source(s3_store, s3_store.put(f"{folder}/bad.tfrecord", bytes(data)), tmp_path)
    assert packed_strings(bad.read_packed(np.array([5, 3]))) == [written[5], written[3]]
    with pytest.raises(CorruptRecordError) as info:
        bad.read_packed(np.arange(2, 8))
    assert "bad.tfrecord, record 4" in str(info.value)
    assert f"byte offset {record_4}" in str(info.value)


def test_object_bodies_are_received_into_recycled_memory(s3_store, tmp_path):
    """A GET's body lands in the buffer pool (no fresh ``bytes`` per GET): reading the
    same 400 KB range again, its cache cleared each time, reuses the memory of the body
    and of the packed batch, and every batch holds its records."""
    url, every = put_tfrecords(s3_store, files=1, count=400, size=1000)
    src = source(s3_store, url, tmp_path)
    indices = np.arange(0, 400)[::-1]
    got = packed_strings(src.read_packed(indices))  # warm: the pool holds both sizes now
    assert got == [every[i] for i in indices]
    fetch.clear()
    allocated, reused = buffers.POOL.allocated, buffers.POOL.reused
    for _ in range(5):
        fetch.clear()
        s3_store.proxy.clear()
        assert packed_strings(src.read_packed(indices)) == got
        assert s3_store.proxy.reads == 1
    assert buffers.POOL.reused - reused >= 10  # the body and the batch, each time
    assert buffers.POOL.allocated - allocated <= 2


def _gets_of_each_way(store, src, batches, every, *, announced: bool,
                      asks: dict[str, int] | None = None) -> dict[str, int]:
    """The proxy's GETs for `batches` read by `read_batch` and by `read_packed`, each
    from a cold cache (every batch announced with `prefetch` first if `announced`);
    both must give the records written. `asks` receives the ranges each way asked of
    the span cache (``fetch.stats()["ranges"]``)."""
    gets = {}
    for way in ("read_batch", "read_packed"):
        fetch.clear()
        store.proxy.clear()
        for indices in batches if announced else []:
            src.prefetch(indices)
        before = fetch.stats()["ranges"]
        for indices in batches:
            got = getattr(src, way)(indices)
            got = got if way == "read_batch" else packed_strings(got)
            assert got == [every[i] for i in indices]
        gets[way] = store.proxy.reads
        if asks is not None:
            asks[way] = fetch.stats()["ranges"] - before
    return gets


@pytest.mark.parametrize("gap", [None, 4 << 10])
def test_shuffled_objects_read_by_runs_cost_no_more_gets_than_record_by_record(
        s3_store, tmp_path, gap):
    """The global shuffle over objects, each batch announced (`prefetch`) before it is
    read: runs are served by the read-ahead's GETs, as records one by one are."""
    url, every = put_tfrecords(s3_store, files=4, count=60, size=1000)
    reads = None if gap is None else dataclasses.replace(FAST, gap_bytes=gap)
    src = source(s3_store, url, tmp_path, reads=reads)
    rng = np.random.default_rng(4)
    batches = [rng.permutation(len(every))[:40] for _ in range(4)]
    gets = _gets_of_each_way(s3_store, src, batches, every, announced=True)
    assert gets["read_packed"] <= gets["read_batch"], gets


def test_objects_read_by_blocks_cost_the_gets_of_record_by_record_reads(s3_store, tmp_path):
    """The block order's reads (`blocked`): runs cut at block boundaries, each served by
    its block's GET; the same records and the same GETs as `read_batch`, with and without
    the batches announced first. Both ask the span cache once per block of a batch, not
    once per record (which sends the same GETs: the blocks are what is fetched), and
    send at most a GET per block."""
    url, every = put_tfrecords(s3_store, files=3, count=50, size=1000)
    src = source(s3_store, url, tmp_path).blocked(8)
    rng = np.random.default_rng(5)
    batches = [np.sort(rng.permutation(np.arange(start, start + 32)))[::-1][:24]
               for start in (0, 40, 90, 118)]
    # (file, block) of each batch: a block that straddles two files is read per file
    blocks = [len({(int(i) // 50, int(i) // 8) for i in indices}) for indices in batches]
    assert sum(blocks) < sum(map(len, batches)) // 4  # so that a per-record ask shows
    for ahead in (False, True):
        asks: dict[str, int] = {}
        gets = _gets_of_each_way(s3_store, src, batches, every, announced=ahead, asks=asks)
        assert gets["read_packed"] == gets["read_batch"] <= sum(blocks), (ahead, gets)
        assert asks == {"read_batch": sum(blocks), "read_packed": sum(blocks)}, (ahead, asks)
