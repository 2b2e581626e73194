"""ArrayRecordSource: ArrayRecord files read by batch, group size 1 required, files in the
fingerprint (skipped only when the optional `array-record` extra is missing)."""

from __future__ import annotations

import numpy as np
import pytest

array_record_module = pytest.importorskip("array_record.python.array_record_module")

from resumeloader import (  # noqa: E402
    Pipeline,
    RecordError,
    ResumableLoader,
    StateMismatchError,
    Workers,
)
from resumeloader.sources import ArrayRecordSource, CorruptRecordError  # noqa: E402

RECORDS = [f"record {i}".encode() * (i % 5) for i in range(30)]


def _write(path, records, options="group_size:1") -> None:
    writer = array_record_module.ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()


@pytest.fixture
def files(tmp_path):
    """Two ArrayRecord files holding RECORDS[:18] and RECORDS[18:]."""
    _write(tmp_path / "part-0.array_record", RECORDS[:18])
    _write(tmp_path / "part-1.array_record", RECORDS[18:])
    return tmp_path


def test_array_record_source_reads_records_across_files_in_order(files):
    """Record i is the i-th record of the sorted files; a batch comes back in request order."""
    source = ArrayRecordSource(str(files / "part-*.array_record"))
    indices = np.array([29, 0, 17, 18, 5, 5], dtype=np.int64)

    assert len(source) == 30
    assert source.read(18) == RECORDS[18]
    assert source.read_batch(indices) == [RECORDS[i] for i in indices]


@pytest.mark.parametrize(
    "workers",
    [{}, {"workers": Workers(2, kind="process")}],
    ids=["no-workers", "processes"],
)
@pytest.mark.parametrize("way", ["for-loop", "dataset"])
def test_loader_over_array_record_yields_records_shuffled(files, way, workers):
    """The loader yields tf.string batches of the stored records in the shuffled order."""
    loader = ResumableLoader(
        ArrayRecordSource(str(files / "part-*.array_record")),
        batch_size=7,
        seed=2,
        num_epochs=1,
        **workers,
    )

    batches = list(loader) if way == "for-loop" else list(loader.dataset())

    order = loader.sampler.epoch_indices(0, 0, 30).tolist()
    assert [r for b in batches for r in b.numpy().tolist()] == [RECORDS[i] for i in order]


def test_array_record_source_group_size_above_one_refused(tmp_path):
    """A file compressed in groups of records is refused, saying how to rewrite it."""
    _write(tmp_path / "grouped.array_record", RECORDS, options="group_size:8")

    with pytest.raises(ValueError) as info:
        ArrayRecordSource(str(tmp_path / "grouped.array_record"))

    assert "group_size:8" in str(info.value)
    assert "'group_size:1'" in str(info.value)


def test_loader_restore_with_other_array_record_files_refused(tmp_path):
    """A checkpoint of other files with as many records is refused, naming the fields."""
    _write(tmp_path / "a.array_record", RECORDS)
    _write(tmp_path / "b.array_record", list(reversed(RECORDS)))
    make = lambda name: ResumableLoader(  # noqa: E731
        ArrayRecordSource(str(tmp_path / name)), batch_size=4, seed=0
    )

    with pytest.raises(StateMismatchError) as info:
        make("b.array_record").set_state(make("a.array_record").get_state())

    assert "source.names" in str(info.value)
    assert "source.content" in str(info.value)


# -- damaged files ------------------------------------------------------------------------


def _random_records(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.bytes(500) for _ in range(count)]  # incompressible: the file spans blocks


def test_array_record_source_truncated_file_refused_naming_it(tmp_path):
    """A truncated file is a ValueError naming it and the reader's reason, chained."""
    path = tmp_path / "cut.array_record"
    _write(path, _random_records(1000))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])

    with pytest.raises(ValueError) as info:
        ArrayRecordSource(str(path))

    assert f"{path} is not a readable ArrayRecord file (truncated or corrupt)" in str(info.value)
    assert "Riegeli" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_loader_corrupt_array_record_block_raises_record_error_naming_file(tmp_path):
    """A damaged block is a RecordError naming the file and the record, the reader's error
    chained (a CorruptRecordError, then the reader's RuntimeError)."""
    path = tmp_path / "bad.array_record"
    _write(path, _random_records(1000))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    loader = ResumableLoader(ArrayRecordSource(str(path)), batch_size=1000, seed=0, shuffle=False)

    with pytest.raises(RecordError) as info:
        next(iter(loader))

    message = str(info.value)
    number = info.value.record_index
    assert f"{path}, record {number}: the ArrayRecord reader failed (RuntimeError" in message
    assert isinstance(info.value.__cause__, CorruptRecordError)
    assert isinstance(info.value.__cause__.__cause__, RuntimeError)
    with pytest.raises(RuntimeError):
        array_record_module.ArrayRecordReader(str(path), "readahead_buffer_size:0").read([number])


def test_array_record_records_at_names_each_records_file_and_number(files):
    """records_at of a shuffled loader names the file and record number of each record."""
    loader = ResumableLoader.from_pipeline(
        Pipeline(ArrayRecordSource(str(files / "part-*.array_record")), seed=3)
        .shuffle().batch(5), num_epochs=1)
    [found] = loader.records_at(3)
    batch = [b.numpy().tolist() for b in loader][3]

    by_file = {"part-0.array_record": RECORDS[:18], "part-1.array_record": RECORDS[18:]}
    assert [by_file[r["file"].rsplit("/", 1)[-1]][r["file_record"]] for r in found.records] == (
        batch
    )
    assert [r["record"] for r in found.records] == [
        r["file_record"] + (18 if r["file"].endswith("part-1.array_record") else 0)
        for r in found.records
    ]
