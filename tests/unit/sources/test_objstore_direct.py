"""S3 GETs sent presigned by urllib3 in reader threads, bodies received in place (`direct`).

moto's S3 server behind the `FaultProxy` (session fixtures, 127.0.0.1). The fault, trust
and read-ahead tests of the storage layer run through this way too; here: that it is
the way taken, that it gives the same bytes as s3fs's own GET (taken where it cannot
be used), that a body lands in the buffer it was given, and that a GET given up stops
reading. No TensorFlow.
"""

from __future__ import annotations

import asyncio
import os
import time

import fsspec.asyn
import numpy as np
import pytest
from _objstore_fixtures import FAST, put_tfrecords, source

from resumeloader.sources import ObjectReads, Storage, TFRecordSource
from resumeloader.sources.storage import direct, fetch, filesystems, objects, protocols


def test_s3_gets_go_presigned_through_reader_threads(s3_store, tmp_path):
    url, every = put_tfrecords(s3_store, files=2, count=10)
    src = source(s3_store, url, tmp_path)
    fetch.clear()
    before = direct.stats()["gets"]
    assert src.read_batch(np.array([1, 12, 7])) == [every[1], every[12], every[7]]
    assert direct.stats()["gets"] - before == 2  # one GET per object touched


def test_s3fs_get_where_presigned_urls_cannot_go_gives_the_same_bytes(s3_store, tmp_path):
    """Certificate checks off (an option urllib3 is not given): s3fs's own GET, the same
    records."""
    url, every = put_tfrecords(s3_store, files=2, count=10)
    options = {**s3_store.options, "client_kwargs": {
        **s3_store.options.get("client_kwargs", {}), "verify": False}}
    src = source(s3_store, url, tmp_path)
    storage = Storage(options=options, reads=FAST)
    other = TFRecordSource(url, index_dir=tmp_path / "index", storage=storage)
    assert not direct.usable(filesystems.filesystem("s3", storage.pairs))
    fetch.clear()
    before = direct.stats()["gets"]
    assert other.read_batch(np.arange(20)) == every
    assert direct.stats()["gets"] == before
    fetch.clear()
    assert src.read_batch(np.arange(20)) == every
    assert direct.stats()["gets"] > before


def test_body_is_received_into_the_buffer_given(s3_store):
    data = bytes(range(256)) * 40
    key = s3_store.put("direct/raw.bin", data)
    obj = objects.stat(key, s3_store.storage().pairs)
    into = np.zeros(1000, np.uint8)
    got = asyncio.run_coroutine_threadsafe(
        protocols.get_once(obj, 300, 1300, into), fsspec.asyn.get_loop()).result(30)
    assert got is into and bytes(into) == data[300:1300]


def test_get_given_up_mid_body_stops_reading(s3_store):
    """A slow body (10 pieces over 8 s), the GET cancelled after its first pieces: its
    reader stops at the next of its reads (`direct.PIECE` bytes) instead of receiving
    the rest into memory that was given up."""
    data = bytes(10 * direct.PIECE)
    key = s3_store.put("direct/slow.bin", data)
    obj = objects.stat(key, s3_store.storage().pairs)
    reads = ObjectReads(attempts=1, timeout=30.0, deadline=60.0)
    s3_store.proxy.inject("slow", 1, where=("read",))
    s3_store.proxy.slow_seconds = 8.0
    try:
        future = fetch._submit(obj, 0, len(data), reads)
        limit = time.monotonic() + 20
        while direct.stats()["in_flight"] == 0 and time.monotonic() < limit:
            time.sleep(0.05)
        assert direct.stats()["in_flight"] >= 1
        time.sleep(1.0)  # the first pieces arrive
        future.cancel()
        limit = time.monotonic() + 5.5  # the whole body would take about 7 s more
        while direct.stats()["in_flight"] and time.monotonic() < limit:
            time.sleep(0.05)
        assert direct.stats()["in_flight"] == 0
        with pytest.raises(Exception):  # noqa: B017 - concurrent or asyncio CancelledError
            future.result(1)
    finally:
        s3_store.proxy.slow_seconds = 3.0
        s3_store.proxy.clear()


def test_certificates_are_checked_against_the_bundle_botocore_resolved(s3_store, tmp_path):
    """The CA bundle a client was given (``verify=path``; ``AWS_CA_BUNDLE`` resolves the
    same way) is the one the direct GETs check against; no check at all: no direct GET."""
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("")
    checked = {**s3_store.options, "client_kwargs": {"verify": str(bundle)}}
    unchecked = {**s3_store.options, "client_kwargs": {"verify": False}}
    loop = fsspec.asyn.get_loop()

    def resolved(options):
        fs = filesystems.filesystem("s3", Storage(options=options).pairs)
        asyncio.run_coroutine_threadsafe(fs.set_session(), loop).result(30)
        return direct.certificates(fs)

    assert resolved(checked) == str(bundle)
    assert resolved(unchecked) is None
    from botocore.httpsession import get_cert_path

    # the environment's (AWS_CA_BUNDLE), or botocore's default bundle
    assert resolved(s3_store.options) == os.environ.get("AWS_CA_BUNDLE", get_cert_path(True))


def test_tasks_of_one_window_announce_its_blocks_once(s3_store, tmp_path, monkeypatch):
    """Read-ahead of a source read by blocks: a task whose blocks are those the last
    announcement named starts nothing (and computes no ranges); a task reaching a new
    block is announced. The GETs are the blocks', one each."""
    url, every = put_tfrecords(s3_store, files=2, count=40)
    src = source(s3_store, url, tmp_path).blocked(10)
    calls = []
    real = fetch.prefetch
    monkeypatch.setattr(fetch, "prefetch", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    fetch.clear()
    s3_store.proxy.clear()
    for task in (np.arange(0, 8), np.arange(2, 10), np.array([9, 1, 5]), np.arange(8, 14)):
        assert src.prefetch(task) is True
    assert len(calls) == 2  # blocks {0}, then {0, 1}
    assert src.read_batch(np.arange(14)) == every[:14]
    assert s3_store.proxy.reads == 2
