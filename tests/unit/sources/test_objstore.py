"""TFRecord, ArrayRecord and HTTP objects through the storage layer: real servers, no TensorFlow.

The servers are moto's S3 server and fake-gcs-server (session fixtures, 127.0.0.1,
`_objstore_fixtures`); every read goes through a `FaultProxy` that counts object GETs
and injects 503s, resets, truncated and slow bodies.
"""

from __future__ import annotations

import subprocess
import sys

import _objstore
import numpy as np
import pytest
from _objstore_fixtures import FAST, put_tfrecords, records, source

from resumeloader import cli
from resumeloader.sources import (
    ArrayRecordSource,
    CorruptRecordError,
    ObjectReads,
    RecordReadError,
    Storage,
    TFRecordSource,
)
from resumeloader.sources.storage import fetch, filesystems, objects


def test_tfrecord_source_reads_every_record_of_objects(store, tmp_path):
    """Records of a glob of objects read in any order are the records written, in order."""
    url, every = put_tfrecords(store)
    src = source(store, url, tmp_path)
    indices = np.random.default_rng(0).permutation(len(every))
    assert len(src) == len(every)
    assert src.read_batch(indices) == [every[i] for i in indices]
    assert src.order_fields()["files"] == "3 files: part-0.tfrecord .. part-2.tfrecord"
    assert "versions" in src.order_fields()


def test_endpoint_and_credentials_come_from_the_standard_environment(store, tmp_path, monkeypatch):
    """No filesystem options: AWS_ENDPOINT_URL / AWS_* or STORAGE_EMULATOR_HOST find the
    server (through the proxy, which sees the GETs)."""
    url, every = put_tfrecords(store, files=2, count=10)
    for key, value in store.environment.items():
        monkeypatch.setenv(key, value)
    src = TFRecordSource(url, index_dir=tmp_path / "index", storage=Storage(reads=FAST))
    fetch.clear()
    store.proxy.clear()
    assert src.read_batch(np.arange(20)) == every
    assert store.proxy.reads == 2


def test_unshuffled_batches_cost_at_most_one_get_per_object(s3_store, tmp_path):
    """Consecutive records: one ranged GET per object a batch touches, never more."""
    url, every = put_tfrecords(s3_store, files=3, count=40)
    src = source(s3_store, url, tmp_path)
    fetch.clear()
    s3_store.proxy.clear()
    for start in range(0, 120, 16):
        before = s3_store.proxy.reads
        batch = np.arange(start, min(120, start + 16))
        assert src.read_batch(batch) == [every[i] for i in batch]
        touched = len(set((batch // 40).tolist()))
        assert s3_store.proxy.reads - before <= touched
    assert all("," not in r for r in s3_store.proxy.ranges)  # never a multi-range request


@pytest.mark.parametrize("kind", _objstore.FAULTS)
def test_every_fault_is_retried_and_no_record_is_partial(store, tmp_path, kind):
    """503s, resets, truncated and slow bodies: retried, every record whole and right."""
    url, every = put_tfrecords(store, files=2, count=30)
    src = source(store, url, tmp_path)
    indices = np.random.default_rng(1).permutation(len(every))[:25]
    reads = ObjectReads(attempts=4, backoff=0.01, timeout=0.5, deadline=10.0)
    src = source(store, url, tmp_path, reads=reads)
    fetch.clear()
    retries = fetch.stats()["retries"]
    with store.faults(kind, 2) as proxy:
        got = src.read_batch(indices)
        assert proxy.faulted[kind] == 2
    if kind != "reset":  # aiohttp re-sends an idempotent request once on a dropped connection
        assert fetch.stats()["retries"] - retries == 2  # retried by us, not in the client
    assert got == [every[i] for i in indices]


def test_corrupt_record_in_an_object_fails_its_crc32c_check(s3_store, tmp_path):
    """A flipped byte in a record's data (its framing intact): CorruptRecordError naming
    the object, the record and its byte offset; the other records read fine."""
    folder = s3_store.folder()
    written = records(0, 10)
    data = bytearray(_objstore.tfrecord_bytes(written))
    record_4 = sum(16 + len(r) for r in written[:4])  # its framing starts here
    data[record_4 + 12 + 5] ^= 0xFF  # a byte of its data, not of its length
    url = s3_store.put(f"{folder}/bad.tfrecord", bytes(data))
    src = source(s3_store, url, tmp_path)
    assert src.read_batch(np.array([3, 5])) == [written[3], written[5]]
    with pytest.raises(CorruptRecordError) as info:
        src.read_batch(np.array([4]))
    message = str(info.value)
    assert "bad.tfrecord, record 4" in message and f"byte offset {record_4}" in message
    assert "fails its CRC32C checksum" in message and info.value.record_index == 4


def test_gets_in_flight_stay_within_the_concurrency_option(s3_store, tmp_path):
    """A batch touching 8 objects, 2 GETs at a time: never more reach the server."""
    url, every = put_tfrecords(s3_store, files=8, count=5)
    reads = ObjectReads(concurrency=2, attempts=4, backoff=0.01, timeout=5.0)
    src = source(s3_store, url, tmp_path, reads=reads)
    fetch.clear()
    s3_store.proxy.clear()
    s3_store.proxy.latency = 0.05  # GETs that overlap, were they let
    try:
        got = src.read_batch(np.arange(0, 40, 5))
    finally:
        s3_store.proxy.latency = 0.0
    assert got == every[::5]
    assert s3_store.proxy.reads == 8 and s3_store.proxy.most_in_flight <= 2  # 8 ungated


def test_read_ahead_stays_within_its_byte_budget_and_serves_the_reads(s3_store, tmp_path):
    """`prefetch` starts GETs up to `readahead_bytes` waiting unread (False past it); a
    later read of those records costs no GET."""
    url, every = put_tfrecords(s3_store, files=4, count=40)  # about 12.9 KB per object
    reads = ObjectReads(readahead_bytes=20_000, attempts=4, backoff=0.01, timeout=5.0)
    src = source(s3_store, url, tmp_path, reads=reads)
    fetch.clear()
    s3_store.proxy.clear()
    assert src.prefetch(np.arange(160)) is False  # one object's GET fits, two do not
    assert src.read_batch(np.arange(40)) == every[:40]
    assert s3_store.proxy.reads == 1  # the read-ahead GET served it
    assert src.read_batch(np.arange(160)) == every
    assert s3_store.proxy.reads == 4
    fetch.clear()
    assert src.prefetch(np.arange(40)) is True  # within the budget


def test_exhausted_retries_name_the_object_range_and_last_error(s3_store, tmp_path):
    """A GET that keeps failing: RecordReadError naming object, byte range and the 503."""
    url, _ = put_tfrecords(s3_store, files=1, count=10)
    # a long timeout per try: on a loaded machine a 1 s one could end a try before its 503
    reads = ObjectReads(attempts=4, backoff=0.01, timeout=20.0, deadline=60.0)
    src = source(s3_store, url, tmp_path, reads=reads)
    with s3_store.faults("503", 100), pytest.raises(RecordReadError) as info:
        src.read_batch(np.array([3]))
    message = str(info.value)
    assert url.replace("*", "0") in message
    assert "bytes [" in message and "failed after 4 tries" in message
    assert "injected 503" in message  # the error the proxy answered with
    assert info.value.record_index == 3


def test_a_get_that_waited_for_a_slot_says_how_long(s3_store):
    """One GET slot, two slow GETs at once: the second waits for the first's slot, and
    its error says how long of its time went to that wait (not to the server)."""
    data = bytes(range(256)) * 8
    obj = objects.stat(s3_store.put(f"{s3_store.folder()}/slot.bin", data),
                       s3_store.storage().pairs)
    reads = ObjectReads(concurrency=1, attempts=1, timeout=1.0, deadline=30.0)
    with s3_store.faults("slow", 2):
        futures = [fetch._submit(obj, 0, 1000, reads), fetch._submit(obj, 1000, 2000, reads)]
        errors = [f.exception(timeout=30) for f in futures]
    assert all(isinstance(e, fetch.ObjectReadError) for e in errors), errors
    assert "waiting for one of the 1 GET slots" not in str(errors[0])
    assert "waiting for one of the 1 GET slots" in str(errors[1])
    assert "failed after 1 try in " in str(errors[1])


def test_object_changed_under_a_live_source_is_refused(store, tmp_path):
    """An object rewritten after the source was built is never read: the error names it."""
    url, every = put_tfrecords(store, files=2, count=20)
    src = source(store, url, tmp_path)
    key = url.split("/", 3)[3].replace("*", "1")
    store.put(key, _objstore.tfrecord_bytes(records(7, 20)))
    fetch.clear()
    assert src.read_batch(np.array([0]))[0] == every[0]  # the other object is fine
    with pytest.raises(CorruptRecordError) as info:
        src.read_batch(np.array([25]))
    assert "part-1.tfrecord changed since the source was built" in str(info.value)


def test_index_is_kept_by_version_so_a_second_build_reads_no_object(s3_store, tmp_path):
    """Building the source again reads no object bytes: the index is cached by version."""
    url, _ = put_tfrecords(s3_store, files=3, count=20)
    source(s3_store, url, tmp_path)
    s3_store.proxy.clear()
    source(s3_store, url, tmp_path)
    assert s3_store.proxy.reads == 0


def test_sidecar_index_lets_a_fresh_machine_skip_the_scan(s3_store, tmp_path, monkeypatch, capsys):
    """`resumeloader index URL` writes sidecars (a progress bar on stderr); a fresh cache reads
    them, not the objects."""
    url, every = put_tfrecords(s3_store, files=3, count=50)
    for key, value in s3_store.environment.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["index", url]) == 0
    printed = capsys.readouterr()
    assert "3 objects, 150 records" in printed.out
    assert "3/3 files, 150 records" in printed.err  # the progress display, on stderr
    fetch.clear()
    s3_store.proxy.clear()
    src = source(s3_store, url, tmp_path / "fresh")
    assert s3_store.proxy.reads == 3  # one sidecar each
    assert s3_store.proxy.bytes_sent == 3 * (128 + 8 * 50)
    assert src.read_batch(np.array([149, 0])) == [every[149], every[0]]


def test_sidecar_of_another_version_is_ignored(s3_store, tmp_path, monkeypatch):
    """A sidecar written for an object's old version is not used for its new one."""
    url, _ = put_tfrecords(s3_store, files=1, count=10)
    for key, value in s3_store.environment.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["index", url]) == 0
    key = url.split("/", 3)[3].replace("*", "0")
    new = records(5, 12)
    s3_store.put(key, _objstore.tfrecord_bytes(new))
    src = source(s3_store, url, tmp_path)
    assert len(src) == 12 and src.read(11) == new[11]


def test_array_record_source_reads_objects_through_a_local_copy(store, tmp_path):
    """ArrayRecord objects: the records written, read from a version-keyed local copy."""
    from array_record.python import array_record_module

    folder = store.folder()
    path = str(tmp_path / "a.array_record")
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    written = records(0, 30)
    for record in written:
        writer.write(record)
    writer.close()
    with open(path, "rb") as f:
        url = store.put(f"{folder}/a.array_record", f.read())
    src = ArrayRecordSource(
        url, storage=store.storage(cache_dir=tmp_path / "cache")
    )
    assert src.read_batch(np.array([29, 0, 7])) == [written[29], written[0], written[7]]
    assert "versions" in src.order_fields()
    copies = tmp_path / "cache" / "objects"
    assert len([p for p in copies.iterdir() if p.is_file()]) == 1  # one copy


def test_memory_and_file_urls_read_like_local_files(tmp_path):
    """``memory://`` objects and ``file://`` paths are sources too."""
    fs = filesystems.filesystem("memory")
    written = records(0, 12)
    fs.pipe_file("/rl-test/m.tfrecord", _objstore.tfrecord_bytes(written))
    mem = TFRecordSource("memory://rl-test/m.tfrecord", index_dir=tmp_path / "ix")
    local = tmp_path / "l.tfrecord"
    local.write_bytes(_objstore.tfrecord_bytes(written))
    on_disk = TFRecordSource(f"file://{local}", index_dir=tmp_path / "ix")
    assert mem.read_batch(np.array([11, 2])) == on_disk.read_batch(np.array([11, 2]))
    assert mem.read(11) == written[11]


def test_import_stays_light_and_a_missing_extra_names_it():
    """``import resumeloader`` imports no storage library; s3:// without s3fs says which extra."""
    code = (
        "import sys\n"
        "import resumeloader\n"
        "heavy = [m for m in ('fsspec', 's3fs', 'gcsfs', 'aiobotocore', 'boto3', 'aiohttp')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "sys.modules['s3fs'] = None\n"
        "try:\n"
        "    resumeloader.sources.TFRecordSource('s3://bucket/x.tfrecord')\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert 'pip install s3fs (the `s3` extra: pip install -e ".[s3]"' in out


def test_http_urls_are_read_by_range_and_pinned_by_etag(s3_store, tmp_path):
    """``http://`` objects (the S3 server's plain URLs): ranged GETs, If-Match on the ETag."""
    folder = s3_store.folder()
    written = records(0, 30)
    public = {"ACL": "public-read"}  # plain HTTP GETs carry no credentials
    s3_store.put(f"{folder}/h.tfrecord", _objstore.tfrecord_bytes(written), **public)
    url = f"{s3_store.proxy.url}/{s3_store.bucket}/{folder}/h.tfrecord"
    src = TFRecordSource(url, index_dir=tmp_path / "index", storage=Storage(reads=FAST))
    assert src.read_batch(np.array([29, 3])) == [written[29], written[3]]
    assert src.order_fields()["versions"]
    s3_store.put(f"{folder}/h.tfrecord", _objstore.tfrecord_bytes(records(1, 30)), **public)
    fetch.clear()
    with pytest.raises(CorruptRecordError, match="changed since the source was built"):
        src.read(3)
