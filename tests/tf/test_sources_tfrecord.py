"""TFRecordSource: random access to TFRecord files through a cached offset index, checked
reads, refused compression, and a fingerprint that knows the files."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, RecordError, ResumableLoader, StateMismatchError
from resumeloader.sources import CorruptRecordError, TFRecordSource, tfrecord_index


def _write(path, records, options=None) -> None:
    with tf.io.TFRecordWriter(str(path), options=options) as writer:
        for record in records:
            writer.write(record)


def _records(count: int, start: int = 0) -> list[bytes]:
    return [
        f"record-{i}:".encode() + bytes(range(i % 7)) * (i % 50)
        for i in range(start, start + count)
    ]


@pytest.fixture
def shards(tmp_path):
    """Three TFRecord files of 20, 0 and 13 records, and every record in order."""
    records = _records(33)
    _write(tmp_path / "data-0.tfrecord", records[:20])
    _write(tmp_path / "data-1.tfrecord", [])
    _write(tmp_path / "data-2.tfrecord", records[20:])
    return tmp_path, records


def _source(folder, pattern="data-*.tfrecord", **kwargs) -> TFRecordSource:
    return TFRecordSource(str(folder / pattern), index_dir=str(folder / "index"), **kwargs)


def test_tfrecord_source_reads_every_record_of_sorted_glob(shards):
    """Record i is the i-th record of the files in sorted order; an empty file is fine."""
    folder, records = shards
    source = _source(folder)

    assert len(source) == 33
    assert [source.read(i) for i in range(33)] == records


def test_tfrecord_source_keeps_list_order(shards):
    """A list of files is read in the order given."""
    folder, records = shards
    source = TFRecordSource(
        [folder / "data-2.tfrecord", folder / "data-0.tfrecord"], index_dir=folder / "index"
    )

    assert source.read(0) == records[20]
    assert source.read(13) == records[0]


def test_tfrecord_source_read_batch_returns_requested_order(shards):
    """A batch's records come back in the requested order, duplicates included."""
    folder, records = shards
    indices = np.array([32, 0, 5, 21, 4, 5, 19, 20], dtype=np.int64)

    assert _source(folder).read_batch(indices) == [records[i] for i in indices]


@pytest.mark.parametrize(
    "workers",
    [{}, {"num_workers": 2, "worker_type": "thread"}, {"num_workers": 2, "worker_type": "process"}],
    ids=["no-workers", "threads", "processes"],
)
@pytest.mark.parametrize("way", ["for-loop", "dataset"])
def test_loader_over_tfrecord_yields_serialized_records(shards, way, workers):
    """The loader yields tf.string batches of the records, shuffled, in every path."""
    folder, records = shards
    loader = ResumableLoader(_source(folder), batch_size=8, seed=3, num_epochs=1, **workers)

    batches = list(loader) if way == "for-loop" else list(loader.dataset())

    order = loader.sampler.epoch_indices(0, 0, 33).tolist()
    assert [r for b in batches for r in b.numpy().tolist()] == [records[i] for i in order]


# -- the index ------------------------------------------------------------------------


def _index_file(folder, name="data-0.tfrecord"):
    return tfrecord_index.cache_path(str(folder / name), str(folder / "index"))


def test_tfrecord_index_reused_while_file_unchanged(shards):
    """A second source maps the stored index instead of building it again."""
    folder, _ = shards
    _source(folder)
    before = os.stat(_index_file(folder))

    _source(folder)

    after = os.stat(_index_file(folder))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert after.st_size == 128 + 8 * 20  # 8 bytes per record


def _append_record(path):
    _write(path, [*_records(20), b"one more"])


def _same_size_new_bytes(path):
    data = bytearray(path.read_bytes())
    data[14] ^= 0xFF  # a byte of record 0's data: same size, new content
    path.write_bytes(bytes(data))


def _same_size_and_mtime_new_head(path):
    stat = os.stat(path)
    _same_size_new_bytes(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize(
    "change",
    [_append_record, _same_size_new_bytes, _same_size_and_mtime_new_head],
    ids=["appended", "rewritten", "same-size-and-mtime"],
)
def test_tfrecord_index_rebuilt_after_file_changes(shards, change):
    """A changed size, modification time or head makes the index be rebuilt."""
    folder, _ = shards
    _source(folder)
    before = os.stat(_index_file(folder)).st_ino

    change(folder / "data-0.tfrecord")
    source = _source(folder, verify_checksums=False)

    assert os.stat(_index_file(folder)).st_ino != before
    expected = 34 if change is _append_record else 33
    assert len(source) == expected


def test_tfrecord_index_in_memory_when_index_dir_unwritable(shards):
    """An index directory that cannot be written warns and keeps the index in memory."""
    folder, records = shards
    blocker = folder / "blocker"
    blocker.write_text("a file, not a directory")

    with pytest.warns(UserWarning, match="kept in memory"):
        source = TFRecordSource(str(folder / "data-0.tfrecord"), index_dir=str(blocker / "sub"))

    assert source.read(19) == records[19]


# -- corruption and compression --------------------------------------------------------


def test_loader_corrupted_data_byte_raises_record_error_naming_file_record_offset(shards):
    """One flipped byte of a record's data: RecordError naming file, record and offset."""
    folder, records = shards
    path = folder / "data-2.tfrecord"
    data = bytearray(path.read_bytes())
    offset = 16 * 5 + sum(len(r) for r in records[20:25])  # record 5 of the file
    data[offset + 12 + 3] ^= 0x01
    path.write_bytes(bytes(data))
    loader = ResumableLoader(_source(folder), batch_size=33, seed=0, shuffle=False)

    with pytest.raises(RecordError) as info:
        next(iter(loader))

    message = str(info.value)
    assert info.value.record_index == 25
    assert f"{path}, record 5 (byte offset {offset})" in message
    assert "fails its CRC32C checksum" in message
    assert isinstance(info.value.__cause__, CorruptRecordError)


def test_tfrecord_source_without_checksums_returns_corrupted_bytes(shards):
    """verify_checksums=False skips the CRC (the corrupted byte comes through)."""
    folder, records = shards
    path = folder / "data-0.tfrecord"
    data = bytearray(path.read_bytes())
    data[12] ^= 0x01
    path.write_bytes(bytes(data))

    assert _source(folder, verify_checksums=False).read(0) != records[0]


def test_tfrecord_source_corrupted_length_field_refused_at_indexing(shards):
    """A corrupt header is found when the index is built, naming record and offset."""
    folder, records = shards
    path = folder / "data-0.tfrecord"
    data = bytearray(path.read_bytes())
    offset = 16 * 3 + sum(len(r) for r in records[:3])
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(ValueError) as info:
        _source(folder)

    assert f"record 3 (byte offset {offset})" in str(info.value)
    assert "checksum" in str(info.value)


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_tfrecord_source_compressed_file_refused_with_reason(tmp_path, kind):
    """GZIP and ZLIB files are refused: no random access, decompress them once."""
    _write(tmp_path / "packed.tfrecord", _records(5), options=kind)

    with pytest.raises(ValueError) as info:
        TFRecordSource(str(tmp_path / "packed.tfrecord"), index_dir=str(tmp_path))

    message = str(info.value)
    assert f"{kind}-compressed" in message
    assert "random positions" in message
    assert "Decompress it once" in message


def test_tfrecord_source_not_a_tfrecord_file_raises_value_error(tmp_path):
    """A text file is not mistaken for records."""
    (tmp_path / "notes.txt").write_text("hello world, this is not a TFRecord file\n")

    with pytest.raises(ValueError) as info:
        TFRecordSource(str(tmp_path / "notes.txt"), index_dir=str(tmp_path))

    assert "is not a valid TFRecord file" in str(info.value)


@pytest.mark.parametrize(
    "paths", ["missing-*.tfrecord", "missing.tfrecord"], ids=["empty-glob", "missing-file"]
)
def test_tfrecord_source_missing_files_raise_file_not_found(tmp_path, paths):
    """A pattern or name that matches nothing raises FileNotFoundError naming it."""
    with pytest.raises(FileNotFoundError) as info:
        TFRecordSource(str(tmp_path / paths), index_dir=str(tmp_path))

    assert "missing" in str(info.value)


# -- identity --------------------------------------------------------------------------


def test_loader_restore_with_other_files_refused_naming_difference(tmp_path):
    """A checkpoint of other files (same number of records) is refused, naming the field."""
    _write(tmp_path / "a.tfrecord", _records(10))
    _write(tmp_path / "b.tfrecord", _records(10, start=100))
    make = lambda name: ResumableLoader(  # noqa: E731
        TFRecordSource(str(tmp_path / name), index_dir=str(tmp_path / "index")),
        batch_size=4,
        seed=0,
    )
    state = make("a.tfrecord").get_state()

    with pytest.raises(StateMismatchError) as info:
        make("b.tfrecord").set_state(state)

    message = str(info.value)
    assert "source.files: checkpoint has '1 file: a.tfrecord'" in message
    assert "source.content" in message


def test_loader_restore_with_same_files_elsewhere_accepted(tmp_path):
    """The same files in another directory (a new mount) restore fine."""
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        _write(tmp_path / folder / "a.tfrecord", _records(10))
    make = lambda folder: ResumableLoader(  # noqa: E731
        TFRecordSource(str(tmp_path / folder / "a.tfrecord"), index_dir=str(tmp_path / "ix")),
        batch_size=4,
        seed=0,
    )
    state = make("one").get_state()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make("two").set_state(state)


def test_tfrecord_pipeline_parses_examples_in_tf_map(tmp_path):
    """Serialized tf.train.Example records parsed by tf.io.parse_example in a tf_map stage."""
    examples = [
        tf.train.Example(
            features=tf.train.Features(
                feature={"x": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, -i]))}
            )
        ).SerializeToString()
        for i in range(9)
    ]
    _write(tmp_path / "ex.tfrecord", examples)
    source = TFRecordSource(str(tmp_path / "ex.tfrecord"), index_dir=str(tmp_path))
    spec = {"x": tf.io.FixedLenFeature((2,), tf.int64)}
    pipeline = Pipeline(source, seed=0).batch(4).tf_map(lambda b, s: tf.io.parse_example(b, spec))

    batches = list(ResumableLoader.from_pipeline(pipeline, num_epochs=1))

    assert [row for b in batches for row in b["x"].numpy().tolist()] == [[i, -i] for i in range(9)]
