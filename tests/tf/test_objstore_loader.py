"""Loaders over object storage: the block order's GETs, failures through the loop, restores
onto changed objects, read-ahead, an image folder in a bucket, SIGKILL and resume.

The servers are moto's S3 server and fake-gcs-server (session fixtures, 127.0.0.1,
`_objstore_fixtures`), read through a `FaultProxy`.
"""

from __future__ import annotations

import os
import sys

import _objstore
import pytest
from _objstore_fixtures import put_tfrecords, records, source

from resumeloader import Pipeline, RecordError, ResumableLoader, StateMismatchError, cli
from resumeloader.sources import ObjectReads
from resumeloader.sources.storage import fetch


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


def test_stats_count_the_storage_layers_gets_and_bytes(s3_store, tmp_path):
    """A loader reading objects shows its GETs, bytes and GET latency in its stats."""
    url, _ = put_tfrecords(s3_store, files=2, count=20, size=1000)
    src = source(s3_store, url, tmp_path)
    fetch.clear()
    loader = ResumableLoader.from_pipeline(
        Pipeline(src, seed=0).shuffle(chunk_records=10).batch(5), num_epochs=1)
    _ = [batch for batch in loader]
    counts = loader.stats().counts
    assert counts["storage.gets"] >= 1 and counts["storage.bytes"] >= 40 * 1000
    assert counts["storage.get_ns"] > 0 and counts["storage.ranges"] >= 40
    assert "GETs" in str(loader.stats())


def test_exhausted_retries_reach_the_loop_as_a_record_error(s3_store, tmp_path):
    """Through the loader the failure is the record's RecordError (on_error's input)."""
    url, _ = put_tfrecords(s3_store, files=1, count=10)
    src = source(s3_store, url, tmp_path)
    loader = ResumableLoader.from_pipeline(Pipeline(src, seed=0).batch(5), num_epochs=1)
    with s3_store.faults("reset", 1000), pytest.raises(RecordError) as info:
        next(iter(loader))
    assert "part-0.tfrecord" in str(info.value) and "bytes [" in str(info.value)
    assert info.value.record_index == 0


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


def test_read_ahead_changes_no_batch(s3_store, tmp_path):
    """With and without read-ahead (and its GETs in flight) the batches are the same."""
    url, _ = put_tfrecords(s3_store, files=3, count=40)

    def batches(reads: fetch.ObjectReads) -> list[list[bytes]]:
        fetch.clear()
        src = source(s3_store, url, tmp_path, reads=reads)
        pipeline = Pipeline(src, seed=9).shuffle(chunk_records=10).batch(8)
        return [b.numpy().tolist() for b in ResumableLoader.from_pipeline(pipeline, num_epochs=1)]

    without = batches(ObjectReads(readahead_bytes=0))
    s3_store.proxy.clear()
    with_readahead = batches(ObjectReads())
    assert with_readahead == without
    assert fetch.stats()["gets"] > 0


@pytest.mark.slow
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
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "train_objstore.py")
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
    src = FileSource(store.url(f"{folder}/*/*.jpg"), storage=store.storage())

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


def test_failing_object_goes_through_on_error_skip(s3_store, tmp_path):
    """An object whose GETs keep failing: its records are replaced by on_error("skip")
    and logged to the quarantine, the other object's records all arrive."""
    url, every = put_tfrecords(s3_store, files=2, count=10)
    reads = ObjectReads(attempts=2, backoff=0.01, timeout=5.0, deadline=10.0)
    src = source(s3_store, url, tmp_path, reads=reads)  # each failing read: 2 GETs
    log = tmp_path / "quarantine.jsonl"
    pipeline = Pipeline(src, seed=0).batch(5).on_error("skip", max_fraction=1.0, quarantine=log)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    fetch.clear()
    s3_store.proxy.clear()
    s3_store.proxy.inject("503", 10**6, match=lambda path: "part-1" in path)
    try:
        got = [record for batch in loader for record in batch.numpy().tolist()]
    finally:
        s3_store.proxy.clear()
    assert len(got) == 20 and set(got) <= set(every[:10])  # part-1's 10 records replaced
    assert set(every[:10]) <= set(got)
    lines = log.read_text().splitlines()
    assert len(lines) == 10 and all("part-1.tfrecord" in line for line in lines)


def test_fetch_clear_between_batches_of_a_live_loader_changes_nothing(s3_store, tmp_path):
    """`fetch.clear()` after every batch, read-ahead in flight: the same batches."""
    url, _ = put_tfrecords(s3_store, files=3, count=20)
    pipeline = Pipeline(source(s3_store, url, tmp_path), seed=4).shuffle(chunk_records=5).batch(6)
    expected = [b.numpy().tolist() for b in ResumableLoader.from_pipeline(pipeline, num_epochs=1)]
    got = []
    for batch in ResumableLoader.from_pipeline(pipeline, num_epochs=1):
        got.append(batch.numpy().tolist())
        fetch.clear()
    assert got == expected


def test_object_deleted_under_a_live_loader_names_that_object(s3_store, tmp_path):
    """An object deleted mid-epoch (read-ahead on, the cache cleared): the batch that needs
    it fails naming that object as gone, never a bare CancelledError."""
    url, _ = put_tfrecords(s3_store, files=3, count=20)
    loader = ResumableLoader.from_pipeline(
        Pipeline(source(s3_store, url, tmp_path), seed=0).batch(10), num_epochs=1
    )
    batches = iter(loader)
    next(batches)
    s3_store.direct.rm(url.split("://", 1)[1].replace("*", "2"))
    fetch.clear()
    with pytest.raises(RecordError) as info:
        for _ in range(5):
            next(batches)
    message = str(info.value)
    assert "part-2.tfrecord changed since the source was built" in message
    assert "it no longer exists" in message and info.value.record_index >= 40
