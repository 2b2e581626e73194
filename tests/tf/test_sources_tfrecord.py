"""TFRecordSource: random access to TFRecord files through a cached offset index, checked
reads, refused compression, and a fingerprint that knows the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, RecordError, ResumableLoader, StateMismatchError, Workers
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
    [{}, {"workers": Workers(2, kind="thread")}, {"workers": Workers(2, kind="process")}],
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


@pytest.mark.parametrize("order", ["global", "blocks"])
@pytest.mark.parametrize("way", ["for-loop", "dataset"])
def test_kept_batches_of_records_read_by_runs_stay_right(tmp_path, order, way):
    """Batches of 128 KiB and more (read by runs into recycled buffers), every one kept
    until the epoch ends: each still holds its records, in the global shuffle and in
    the block order."""
    records = [bytes([i % 251]) * 8000 + f"record-{i}".encode() for i in range(96)]
    _write(tmp_path / "big-0.tfrecord", records[:50])
    _write(tmp_path / "big-1.tfrecord", records[50:])
    source = _source(tmp_path, "big-*.tfrecord")
    pipeline = Pipeline(source, seed=5)
    pipeline = pipeline.shuffle() if order == "global" else pipeline.shuffle(
        chunk_records=8, window_chunks=2)
    loader = ResumableLoader.from_pipeline(pipeline.batch(16), num_epochs=1)

    batches = list(loader) if way == "for-loop" else list(loader.dataset())

    order_ = loader.plan.indices(0, 0, 96).tolist()
    assert [r for b in batches for r in b.numpy().tolist()] == [records[i] for i in order_]


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


def _fixed(count: int, start: int) -> list[bytes]:
    """Records of one size whose bytes depend on `start`."""
    return [b"%08d" % (start + i) for i in range(count)]


def test_loader_restore_after_shards_regenerated_with_same_sizes_refused(tmp_path):
    """Shards rewritten under the same names with records of the same sizes are other data."""
    for shard in range(2):
        _write(tmp_path / f"s-{shard}.tfrecord", _fixed(50, 100 * shard))
    make = lambda: ResumableLoader(  # noqa: E731
        TFRecordSource(str(tmp_path / "s-*.tfrecord"), index_dir=str(tmp_path / "ix")),
        batch_size=10,
        seed=0,
    )
    old = make()
    old.advance(5)
    state = old.get_state()
    for shard in range(2):
        _write(tmp_path / f"s-{shard}.tfrecord", _fixed(50, 1000 + 100 * shard))

    with pytest.raises(StateMismatchError) as info:
        make().set_state(state)

    assert "source.identity" in str(info.value)
    assert "source.content" not in str(info.value)  # same sizes, same record layout


def test_tfrecord_edited_cached_index_not_trusted(shards):
    """A stored index whose offsets were edited is rebuilt, not used to read other bytes."""
    folder, records = shards
    _source(folder)
    stored = Path(_index_file(folder))
    data = bytearray(stored.read_bytes())
    data[128 + 8 * 3] += 4  # record 3 would start 4 bytes late
    stored.write_bytes(bytes(data))

    source = _source(folder)

    assert [source.read(i) for i in range(33)] == records
    assert stored.read_bytes() != bytes(data)  # rebuilt


def test_tfrecord_source_literal_path_with_glob_characters_reads_that_file(tmp_path):
    """`shard[1].tfrecord` names that file, not the glob's match `shard1.tfrecord`."""
    _write(tmp_path / "shard[1].tfrecord", [b"literal"])
    _write(tmp_path / "shard1.tfrecord", [b"globbed"])

    source = TFRecordSource(str(tmp_path / "shard[1].tfrecord"), index_dir=str(tmp_path / "ix"))

    assert source.read_batch(np.arange(len(source))) == [b"literal"]


def test_tfrecord_glob_under_directory_with_glob_characters_matches_its_files(tmp_path):
    """A pattern's existing directory is taken literally (`run[1]/*.tfrecord`)."""
    (tmp_path / "run[1]").mkdir()
    (tmp_path / "run1").mkdir()
    _write(tmp_path / "run[1]" / "a.tfrecord", [b"literal"])
    _write(tmp_path / "run1" / "a.tfrecord", [b"globbed"])

    source = TFRecordSource(str(tmp_path / "run[1]" / "*.tfrecord"), index_dir=str(tmp_path))

    assert source.read_batch(np.arange(len(source))) == [b"literal"]


@pytest.mark.parametrize("way", ["bytes-path", "glob"])
def test_loader_over_non_utf8_file_name_reads_and_restores(tmp_path, way):
    """A file name that is not UTF-8 is read, named in the state and restored."""
    _write(tmp_path / "plain.tfrecord", _records(12))
    name = os.path.join(os.fsencode(tmp_path), b"data-\xff\xfe.tfrecord")
    os.rename(tmp_path / "plain.tfrecord", name)
    paths = name if way == "bytes-path" else str(tmp_path / "data-*.tfrecord")
    make = lambda: ResumableLoader(  # noqa: E731
        TFRecordSource(paths, index_dir=str(tmp_path / "ix")), batch_size=5, seed=1
    )
    loader = make()
    first = next(iter(loader)).numpy().tolist()
    state = json.loads(json.dumps(loader.get_state()))
    restored = make()

    restored.set_state(state)

    order = loader.sampler.epoch_indices(0, 0, 12).tolist()
    assert first == [_records(12)[i] for i in order[:5]]
    assert "\\xff\\xfe" in state["source.files"]
    assert next(iter(restored)).numpy().tolist() == [_records(12)[i] for i in order[5:10]]


# -- limits: file size and file descriptors, in a child process -----------------------

_LIMITED = """
import json, os, resource, sys, warnings
limits = json.loads(sys.argv[1])
for name, value in limits.items():
    soft, hard = resource.getrlimit(getattr(resource, name))
    resource.setrlimit(getattr(resource, name), (value, hard))
from resumeloader.sources import TFRecordSource
"""


def _run_limited(limits: dict[str, int], code: str, *args: str) -> dict:
    """Runs `code` (after _LIMITED) in a fresh interpreter with `limits`; its JSON output."""
    result = subprocess.run(
        [sys.executable, "-c", _LIMITED + code, json.dumps(limits), *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tfrecord_index_write_failure_leaves_no_temp_file(tmp_path):
    """An index that cannot be written (file size limit) warns, leaves no temp file, reads."""
    _write(tmp_path / "big.tfrecord", _records(2000))
    code = """
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    source = TFRecordSource(sys.argv[2], index_dir=sys.argv[3])
records = source.read_batch(list(range(len(source))))
print(json.dumps({"warnings": [str(w.message) for w in caught], "count": len(records),
                  "last": records[-1].decode("latin-1"), "left": os.listdir(sys.argv[3])}))
"""
    index_dir = tmp_path / "ix"
    index_dir.mkdir()

    out = _run_limited(
        {"RLIMIT_FSIZE": 4096}, code, str(tmp_path / "big.tfrecord"), str(index_dir)
    )

    assert out["left"] == []  # neither the index nor its temporary file
    assert any("kept in memory" in w for w in out["warnings"])
    assert (out["count"], out["last"]) == (2000, _records(2000)[-1].decode("latin-1"))


def _many_files(folder, count: int) -> list[bytes]:
    """`count` TFRecord files of one record each: one file written by TensorFlow, split."""
    records = [b"shard-%05d:" % i + bytes(i % 11) for i in range(count)]
    _write(folder / "all.bin", records)
    data, at = (folder / "all.bin").read_bytes(), 0
    for i, record in enumerate(records):
        end = at + 16 + len(record)
        (folder / f"part-{i:05d}.tfrecord").write_bytes(data[at:end])
        at = end
    os.unlink(folder / "all.bin")
    return records


def test_tfrecord_source_reads_10000_files_with_ulimit_1024(tmp_path):
    """10,000 shards under `ulimit -n 1024`: built, read in a shuffled order, few open."""
    records = _many_files(tmp_path, 10_000)
    code = """
import numpy as np
source = TFRecordSource(sys.argv[2], index_dir=sys.argv[3])
order = np.random.default_rng(0).permutation(len(source))
out = []
for start in range(0, len(order), 500):
    out += source.read_batch(order[start:start + 500])
again = TFRecordSource(sys.argv[2], index_dir=sys.argv[3]).read_batch(np.arange(3))
print(json.dumps({"order": order.tolist(), "records": [r.decode("latin-1") for r in out],
                  "again": [r.decode("latin-1") for r in again],
                  "open": len(os.listdir("/proc/self/fd"))}))
"""
    out = _run_limited(
        {"RLIMIT_NOFILE": 1024}, code, str(tmp_path / "part-*.tfrecord"), str(tmp_path / "ix")
    )

    expected = [records[i].decode("latin-1") for i in out["order"]]
    assert out["records"] == expected
    assert out["again"] == [r.decode("latin-1") for r in records[:3]]
    assert out["open"] <= 256 + 16  # the cache's budget (1024 // 4) and the interpreter's own


def test_tfrecord_source_without_descriptors_left_names_ulimit(tmp_path):
    """When other code holds every descriptor, the error names `ulimit -n` and the limit."""
    _write(tmp_path / "a.tfrecord", _records(3))
    code = """
import numpy as np
source = TFRecordSource(sys.argv[2], index_dir=sys.argv[3])
np.unique(np.arange(3))  # what a read imports lazily is imported before the exhaustion
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    source.read(0)
    print(json.dumps({"error": None}))
except OSError as err:
    print(json.dumps({"error": type(err).__name__, "message": str(err)}))
"""
    out = _run_limited(
        {"RLIMIT_NOFILE": 64}, code, str(tmp_path / "a.tfrecord"), str(tmp_path / "ix")
    )

    assert out["error"] == "TooManyOpenFiles"
    assert "(`ulimit -n`) is 64" in out["message"]
    assert "a.tfrecord" in out["message"]
