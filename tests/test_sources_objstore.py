"""TFRecord and ArrayRecord sources over object storage: real servers, a fault proxy, versions.

The servers are moto's S3 server and fake-gcs-server (session fixtures, 127.0.0.1,
`_objstore_fixtures`); every read goes through a `FaultProxy` that counts object GETs
and injects 503s, resets, truncated and slow bodies.
"""

from __future__ import annotations

import os
import subprocess
import sys

import _objstore
import numpy as np
import pytest

from resumeloader import Pipeline, RecordError, ResumableLoader, StateMismatchError, cli
from resumeloader.sources import (
    ArrayRecordSource,
    CorruptRecordError,
    RecordReadError,
    TFRecordSource,
    fetch,
    storage,
)

FAST = fetch.ObjectReads(attempts=4, backoff=0.01, timeout=1.0, deadline=10.0)


def records(file: int, count: int, size: int = 300) -> list[bytes]:
    return [b"%d:%d:" % (file, i) + bytes([i % 251]) * size for i in range(count)]


def put_tfrecords(store, files=3, count=40, size=300) -> tuple[str, list[bytes]]:
    """`files` TFRecord objects of `count` records in a fresh folder; (glob URL, all records)."""
    folder = store.folder()
    every = []
    for file in range(files):
        data = records(file, count, size)
        store.put(f"{folder}/part-{file}.tfrecord", _objstore.tfrecord_bytes(data))
        every += data
    return store.url(f"{folder}/part-*.tfrecord"), every


def source(store, url: str, tmp_path, **kwargs) -> TFRecordSource:
    kwargs.setdefault("object_reads", FAST)
    folder = tmp_path / "index"
    return TFRecordSource(url, index_dir=folder, storage_options=store.options, **kwargs)


def test_tfrecord_source_reads_every_record_of_objects(store, tmp_path):
    """Records of a glob of objects read in any order are the records written, in order."""
    url, every = put_tfrecords(store)
    src = source(store, url, tmp_path)
    indices = np.random.default_rng(0).permutation(len(every))
    assert len(src) == len(every)
    assert src.read_batch(indices) == [every[i] for i in indices]
    assert src.order_fields()["files"] == "3 files: part-0.tfrecord .. part-2.tfrecord"
    assert "versions" in src.order_fields()


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


def test_block_order_reads_each_chunk_with_one_get(s3_store, tmp_path):
    """With the block order a whole epoch costs one GET per run of chunks, not per record."""
    url, every = put_tfrecords(s3_store, files=4, count=50, size=3000)
    src = source(s3_store, url, tmp_path)
    pipeline = Pipeline(src, seed=3).shuffle(chunk_records=25, window_chunks=2).batch(10)
    fetch.clear()
    s3_store.proxy.clear()
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    got = [record for batch in loader for record in batch.numpy().tolist()]
    assert sorted(got) == sorted(every)
    assert s3_store.proxy.reads <= 8  # 8 chunks of 25 records (75 KB each): 8 GETs at most
    assert pipeline.order_fields()["blocks.chunk_records"] == 25


@pytest.mark.parametrize("kind", _objstore.FAULTS)
def test_every_fault_is_retried_and_no_record_is_partial(store, tmp_path, kind):
    """503s, resets, truncated and slow bodies: retried, every record whole and right."""
    url, every = put_tfrecords(store, files=2, count=30)
    src = source(store, url, tmp_path)
    indices = np.random.default_rng(1).permutation(len(every))[:25]
    reads = fetch.ObjectReads(attempts=4, backoff=0.01, timeout=0.5, deadline=10.0)
    src = source(store, url, tmp_path, object_reads=reads)
    with store.faults(kind, 2) as proxy:
        got = src.read_batch(indices)
        assert proxy.faulted[kind] == 2
    assert got == [every[i] for i in indices]


def test_exhausted_retries_name_the_object_range_and_last_error(s3_store, tmp_path):
    """A GET that keeps failing: RecordReadError naming object, byte range and the 503."""
    url, _ = put_tfrecords(s3_store, files=1, count=10)
    # a long timeout per try: on a loaded machine a 1 s one could end a try before its 503
    reads = fetch.ObjectReads(attempts=4, backoff=0.01, timeout=20.0, deadline=60.0)
    src = source(s3_store, url, tmp_path, object_reads=reads)
    with s3_store.faults("503", 100), pytest.raises(RecordReadError) as info:
        src.read_batch(np.array([3]))
    message = str(info.value)
    assert url.replace("*", "0") in message
    assert "bytes [" in message and "failed after 4 tries" in message
    assert "injected 503" in message  # the error the proxy answered with
    assert info.value.record_index == 3


def test_exhausted_retries_reach_the_loop_as_a_record_error(s3_store, tmp_path):
    """Through the loader the failure is the record's RecordError (on_error's input)."""
    url, _ = put_tfrecords(s3_store, files=1, count=10)
    src = source(s3_store, url, tmp_path)
    loader = ResumableLoader.from_pipeline(Pipeline(src, seed=0).batch(5), num_epochs=1)
    with s3_store.faults("reset", 1000), pytest.raises(RecordError) as info:
        next(iter(loader))
    assert "part-0.tfrecord" in str(info.value) and "bytes [" in str(info.value)
    assert info.value.record_index == 0


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


def test_object_changed_between_save_and_restore_is_refused(s3_store, tmp_path):
    """A checkpoint of an object's old version does not restore onto its new one."""
    url, _ = put_tfrecords(s3_store, files=2, count=20)
    loader = ResumableLoader.from_pipeline(
        Pipeline(source(s3_store, url, tmp_path), seed=0).shuffle().batch(4), num_epochs=1
    )
    next(iter(loader))
    state = loader.get_state()
    key = url.split("/", 3)[3].replace("*", "0")
    s3_store.put(key, _objstore.tfrecord_bytes(records(0, 20)[::-1]))  # same sizes, new order
    fresh = ResumableLoader.from_pipeline(
        Pipeline(source(s3_store, url, tmp_path), seed=0).shuffle().batch(4), num_epochs=1
    )
    with pytest.raises(StateMismatchError) as info:
        fresh.set_state(state)
    assert "source.versions" in str(info.value)
    changed = url.replace("*", "0")  # named, with its two versions, by this machine's record
    assert f"objects changed since the checkpoint: {changed} (version" in str(info.value)
    assert url.replace("*", "1") not in str(info.value)


def test_index_is_kept_by_version_so_a_second_build_reads_no_object(s3_store, tmp_path):
    """Building the source again reads no object bytes: the index is cached by version."""
    url, _ = put_tfrecords(s3_store, files=3, count=20)
    source(s3_store, url, tmp_path)
    s3_store.proxy.clear()
    source(s3_store, url, tmp_path)
    assert s3_store.proxy.reads == 0


def test_sidecar_index_lets_a_fresh_machine_skip_the_scan(s3_store, tmp_path, monkeypatch, capsys):
    """`resumeloader index URL` writes sidecars; a fresh cache reads them, not the objects."""
    url, every = put_tfrecords(s3_store, files=3, count=50)
    for key, value in s3_store.environment.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["index", url]) == 0
    assert "3 objects, 150 records" in capsys.readouterr().out
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
        url, storage_options=store.options, object_reads=FAST, cache_dir=tmp_path / "copies"
    )
    assert src.read_batch(np.array([29, 0, 7])) == [written[29], written[0], written[7]]
    assert "versions" in src.order_fields()
    assert len([p for p in (tmp_path / "copies").iterdir() if p.is_file()]) == 1  # one copy


def test_memory_and_file_urls_read_like_local_files(tmp_path):
    """``memory://`` objects and ``file://`` paths are sources too."""
    fs = storage.filesystem("memory")
    written = records(0, 12)
    fs.pipe_file("/rl-test/m.tfrecord", _objstore.tfrecord_bytes(written))
    mem = TFRecordSource("memory://rl-test/m.tfrecord", index_dir=tmp_path / "ix")
    local = tmp_path / "l.tfrecord"
    local.write_bytes(_objstore.tfrecord_bytes(written))
    on_disk = TFRecordSource(f"file://{local}", index_dir=tmp_path / "ix")
    assert mem.read_batch(np.array([11, 2])) == on_disk.read_batch(np.array([11, 2]))
    assert mem.read(11) == written[11]


def test_read_ahead_changes_no_batch(s3_store, tmp_path):
    """With and without read-ahead (and its GETs in flight) the batches are the same."""
    url, _ = put_tfrecords(s3_store, files=3, count=40)

    def batches(reads: fetch.ObjectReads) -> list[list[bytes]]:
        fetch.clear()
        src = source(s3_store, url, tmp_path, object_reads=reads)
        pipeline = Pipeline(src, seed=9).shuffle(chunk_records=10).batch(8)
        return [b.numpy().tolist() for b in ResumableLoader.from_pipeline(pipeline, num_epochs=1)]

    without = batches(fetch.ObjectReads(readahead_bytes=0))
    s3_store.proxy.clear()
    with_readahead = batches(fetch.ObjectReads())
    assert with_readahead == without
    assert fetch.stats()["gets"] > 0


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
    assert "pip install 'resumeloader[s3]'" in out


@pytest.mark.slow
@pytest.mark.timeout(300)  # four TensorFlow processes in turn, on a loaded machine
def test_verify_sigkill_job_reading_s3_reports_identical(s3_store, tmp_path, monkeypatch, capsys):
    """A job whose data is in the S3 server, SIGKILLed twice (once mid-save), resumes exactly."""
    import tensorflow as tf

    folder = s3_store.folder()
    for part in range(3):
        examples = []
        for i in range(40):
            x = [float((part * 40 + i) % 7), float(i % 3), float(part), 1.0]
            feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x))}
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            examples.append(example.SerializeToString())
        s3_store.put(f"{folder}/train-{part}.tfrecord", _objstore.tfrecord_bytes(examples))
    for key, value in s3_store.environment.items():  # the job finds the endpoint there
        monkeypatch.setenv(key, value)
    script = os.path.join(os.path.dirname(__file__), "scripts", "train_objstore.py")
    argv = [
        "verify", "--workdir", str(tmp_path / "verify"),
        "--kill-at", "step:5", "--kill-at", "save:20",
        "--", sys.executable, script, s3_store.url(f"{folder}/train-*.tfrecord"),
        "--index-dir", str(tmp_path / "index"),
    ]
    status = cli.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "IDENTICAL: same batches, same order, same bytes, same final weights" in out


def test_file_source_reads_an_image_folder_in_a_bucket_with_tf_map(store, tmp_path):
    """JPEG objects under class folders: decoded by tf_map, labels from the paths."""
    import tensorflow as tf

    from resumeloader.sources import FileSource

    folder = store.folder()
    for i in range(6):
        image = tf.io.encode_jpeg(tf.fill((4, 4, 3), tf.constant(i * 40, tf.uint8))).numpy()
        store.put(f"{folder}/class-{i % 2}/{i}.jpg", image)
    src = FileSource(store.url(f"{folder}/*/*.jpg"), storage_options=store.options)

    def decode(batch, seeds):
        images = tf.map_fn(
            lambda data: tf.io.decode_jpeg(data, channels=3), batch["data"],
            fn_output_signature=tf.TensorSpec((4, 4, 3), tf.uint8),
        )
        labels = tf.strings.to_number(tf.strings.substr(batch["path"], -7, 1), tf.int32)
        return images, labels

    pipeline = Pipeline(src, seed=0).shuffle().batch(3).tf_map(decode)
    seen = [(images.numpy(), labels.numpy()) for images, labels in
            ResumableLoader.from_pipeline(pipeline, num_epochs=1)]
    labels = sorted(int(label) for _, batch in seen for label in batch)
    assert labels == [0, 0, 0, 1, 1, 1]
    assert all(images.shape == (3, 4, 4, 3) for images, _ in seen)
    assert src.paths[0].endswith("/class-0/0.jpg") and "versions" not in src.order_fields()


def test_http_urls_are_read_by_range_and_pinned_by_etag(s3_store, tmp_path):
    """``http://`` objects (the S3 server's plain URLs): ranged GETs, If-Match on the ETag."""
    folder = s3_store.folder()
    written = records(0, 30)
    public = {"ACL": "public-read"}  # plain HTTP GETs carry no credentials
    s3_store.put(f"{folder}/h.tfrecord", _objstore.tfrecord_bytes(written), **public)
    url = f"{s3_store.proxy.url}/{s3_store.bucket}/{folder}/h.tfrecord"
    src = TFRecordSource(url, index_dir=tmp_path / "index", object_reads=FAST)
    assert src.read_batch(np.array([29, 3])) == [written[29], written[3]]
    assert src.order_fields()["versions"]
    s3_store.put(f"{folder}/h.tfrecord", _objstore.tfrecord_bytes(records(1, 30)), **public)
    fetch.clear()
    with pytest.raises(CorruptRecordError, match="changed since the source was built"):
        src.read(3)
