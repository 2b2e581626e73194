"""Read-ahead of objects: any depth, any budget, split GETs and slow bodies give the same stream.

The server is moto's S3 server (a session fixture, 127.0.0.1, `_objstore_fixtures`),
read through a `FaultProxy` that counts the GETs and the ranges they ask for.
"""

from __future__ import annotations

import logging

import _objstore
import numpy as np
import pytest
from _objstore_fixtures import FAST, put_tfrecords, records, source

from resumeloader import Pipeline, ResumableLoader
from resumeloader.sources import ObjectReads
from resumeloader.sources.storage import fetch

CHUNK, WINDOW, BATCH = 10, 2, 5


def _reads(**kwargs: object) -> ObjectReads:
    return ObjectReads(attempts=FAST.attempts, backoff=FAST.backoff, timeout=FAST.timeout,
                       deadline=FAST.deadline, **kwargs)


def _stream(s3_store, url, tmp_path, reads, *, epochs=2, slow=0):
    """Every batch of `epochs` epochs in the block order, read with `reads` (after
    `slow` GETs whose bodies trickle slower than the read timeout)."""
    fetch.clear()
    src = source(s3_store, url, tmp_path, reads=reads)
    pipeline = Pipeline(src, seed=4).shuffle(chunk_records=CHUNK, window_chunks=WINDOW)
    loader = ResumableLoader.from_pipeline(pipeline.batch(BATCH), num_epochs=epochs)
    if not slow:
        return [b.numpy().tolist() for b in loader], s3_store.proxy.reads
    with s3_store.faults("slow", slow) as proxy:
        got = [b.numpy().tolist() for b in loader]
        assert proxy.faulted["slow"] == slow
        return got, proxy.reads


@pytest.mark.parametrize(
    ("reads", "slow"),
    [(_reads(readahead_bytes=1), 0), (_reads(readahead_bytes="auto"), 0),
     (_reads(readahead_bytes=1 << 20, part_bytes=1000), 0),
     (_reads(readahead_bytes="auto", part_bytes=1500), 2), (_reads(readahead_bytes=1), 2)],
    ids=["readahead-1", "readahead-auto", "parts", "auto-parts-slow", "readahead-1-slow"],
)
def test_any_read_ahead_gives_the_stream_of_none(s3_store, tmp_path, reads, slow):
    """Read-ahead 0, 1 byte, auto, GETs split into parts, slow bodies: the same batches."""
    url, every = put_tfrecords(s3_store, files=3, count=40, size=300)
    reference, _ = _stream(s3_store, url, tmp_path, _reads(readahead_bytes=0))
    assert sorted(r for b in reference[: len(every) // BATCH] for r in b) == sorted(every)
    s3_store.proxy.clear()
    got, gets = _stream(s3_store, url, tmp_path, reads, slow=slow)
    assert got == reference
    assert gets > slow


def test_split_gets_send_parts_of_at_most_part_bytes(s3_store, tmp_path):
    """A block longer than `part_bytes` is read by ranged GETs of at most that many bytes."""
    url, _ = put_tfrecords(s3_store, files=1, count=40, size=300)
    s3_store.proxy.clear()
    _stream(s3_store, url, tmp_path, _reads(part_bytes=1000), epochs=1)
    sizes = [int(b) - int(a) + 1 for a, b in (
        r.removeprefix("bytes=").split("-") for r in s3_store.proxy.ranges)]
    assert sizes and max(sizes) <= 1000
    assert s3_store.proxy.reads > 4  # 4 blocks of about 3.1 KB: several parts each


def test_read_ahead_stays_within_its_byte_budget(s3_store, tmp_path):
    """At every batch the bytes read ahead and unused are at most `readahead_bytes`."""
    url, _ = put_tfrecords(s3_store, files=4, count=40, size=300)
    block = 10 * 320  # about a chunk of 10 records
    budget = 3 * block
    fetch.clear()
    src = source(s3_store, url, tmp_path, reads=_reads(readahead_bytes=budget))
    pipeline = Pipeline(src, seed=4).shuffle(chunk_records=CHUNK, window_chunks=WINDOW)
    seen = []
    for batch in ResumableLoader.from_pipeline(pipeline.batch(BATCH), num_epochs=1):
        seen.append(fetch.ahead_bytes())
        assert batch.shape[0] == BATCH
    assert max(seen) <= budget
    assert max(seen) > 0  # it did read ahead


def test_auto_read_ahead_decides_within_the_cache_and_logs_it(s3_store, tmp_path, caplog):
    """With readahead_bytes='auto' the budget is chosen from the measured GETs: each
    choice is an INFO line and in stats().decisions, and what is read ahead stays
    within the cache beside a read's spans."""
    url, _ = put_tfrecords(s3_store, files=4, count=40, size=300)
    cache = 40_000  # 3.1 KB blocks: the data (51 KB) does not fit, epoch 2 GETs again
    fetch.clear()
    src = source(s3_store, url, tmp_path, reads=_reads(cache_bytes=cache))
    pipeline = Pipeline(src, seed=4).shuffle(chunk_records=CHUNK, window_chunks=WINDOW)
    loader = ResumableLoader.from_pipeline(pipeline.batch(BATCH), num_epochs=3)
    s3_store.proxy.latency = 0.03  # GETs long enough to measure (8 tasks and 0.2 s a look)
    seen = []
    try:
        with caplog.at_level(logging.INFO, logger="resumeloader.workers"):
            got = []
            for batch in loader:
                got.append(batch.numpy().tolist())
                seen.append(fetch.ahead_bytes())
    finally:
        s3_store.proxy.latency = 0.0
    decisions = [d for d in loader.stats().decisions if "readahead_bytes" in d]
    assert decisions, "no read-ahead decision in 3 epochs"
    assert all(0 < d["readahead_bytes"] <= cache for d in decisions)
    assert "MB per GET" not in decisions[0]["why"] and "ms per GET" in decisions[0]["why"]
    assert sum("readahead_bytes='auto'" in r.getMessage() for r in caplog.records) == len(
        decisions)
    assert "readahead_bytes='auto' after task" in str(loader.stats())
    assert max(seen) <= cache // 2 or max(seen) <= max(d["readahead_bytes"] for d in decisions)
    reference, _ = _stream(s3_store, url, tmp_path, _reads(readahead_bytes=0), epochs=3)
    assert got == reference
    assert "readahead" not in str(loader.get_state())  # no decision in the state


def test_restore_mid_window_reads_nothing_of_the_past(s3_store, tmp_path):
    """A restore in the middle of a window GETs only chunks holding records still to come
    (no gap merging: a GET of two chunks would read the one between them)."""
    data = records(0, 160, 300)
    url = s3_store.put(f"{s3_store.folder()}/one.tfrecord", _objstore.tfrecord_bytes(data))
    offsets = np.cumsum([0] + [len(r) + 16 for r in data])

    def loader():
        src = source(s3_store, url, tmp_path, reads=_reads(gap_bytes=0))
        pipeline = Pipeline(src, seed=4).shuffle(chunk_records=CHUNK, window_chunks=WINDOW)
        return ResumableLoader.from_pipeline(pipeline.batch(BATCH), num_epochs=1)

    fetch.clear()
    first = loader()
    it = iter(first)
    past = [next(it).numpy().tolist() for _ in range(10)]  # position 50: window 2 of 8, mid
    state = first.get_state()
    assert state["offset"] == 50
    fetch.clear()
    s3_store.proxy.clear()
    fresh = loader()
    fresh.set_state(state)
    rest = [b.numpy().tolist() for b in fresh]
    number = {r: k for k, r in enumerate(data)}
    past_chunks = {number[r] // CHUNK for b in past[:8] for r in b}  # windows 0 and 1
    rest_chunks = {number[r] // CHUNK for b in rest for r in b}
    assert len(past_chunks) == 4 and not past_chunks & rest_chunks
    fetched = set()
    for header in s3_store.proxy.ranges:
        a, b = (int(x) for x in header.removeprefix("bytes=").split("-"))
        first_record = int(np.searchsorted(offsets, a, side="right")) - 1
        last_record = int(np.searchsorted(offsets, b, side="right")) - 1
        fetched |= {n // CHUNK for n in range(first_record, last_record + 1)}
    assert fetched == rest_chunks
    assert sorted(r for b in past + rest for r in b) == sorted(data)
