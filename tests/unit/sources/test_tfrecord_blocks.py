"""TFRecord local files read by blocks (the block order, `TFRecordSource.blocked`): each
block of a window read by one pread and held for its other records, the same records and
errors as record-by-record reads, the reads counted by `handles.stats`; no TensorFlow."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from _objstore_fixtures import packed_strings, records, tfrecord_files

from resumeloader import Pipeline
from resumeloader.sources import CorruptRecordError, TFRecordSource, tfrecord
from resumeloader.sources.storage import handles


def _blocked(paths: list[str], index_dir, **kwargs) -> tuple[TFRecordSource, np.ndarray]:
    """The source of a block order of chunks of 20 records in windows of 2, and its epoch 0."""
    pipeline = Pipeline(TFRecordSource(paths, index_dir=index_dir, **kwargs), seed=3).shuffle(
        chunk_records=20, window_chunks=2)
    order = pipeline.index_stage.indices(0, np.arange(len(pipeline.source)), seed=3)
    return pipeline.source, order


@pytest.mark.parametrize("read", ["read_packed", "read_batch"])
def test_an_epoch_reads_each_local_block_once_with_one_pread(tmp_path, read):
    """An epoch in the block order, batches of 16: the records of the order, and one pread
    per piece of a block in a file (blocks of 20 cross the files' ends at 50 and 100),
    which together read every file once, whole."""
    paths, every = tfrecord_files(str(tmp_path))
    src, order = _blocked(paths, tmp_path / "index")
    assert src._held is not None
    before = handles.stats()
    for start in range(0, len(order), 16):
        indices = order[start : start + 16]
        got = getattr(src, read)(indices)
        found = packed_strings(got) if read == "read_packed" else got
        assert found == [every[i] for i in indices]
    after = handles.stats()
    pieces = {(i // 50, i // 20) for i in range(150)}  # (file, block)
    assert after["reads"] - before["reads"] == len(pieces) == 9
    assert after["bytes"] - before["bytes"] == sum(map(os.path.getsize, paths))
    # read record by record (the global shuffle's source): one pread per record here
    plain = TFRecordSource(paths, index_dir=tmp_path / "index")
    before = handles.stats()["reads"]
    assert packed_strings(plain.read_packed(order[:16])) == [every[i] for i in order[:16]]
    assert handles.stats()["reads"] - before > 1


def test_blocks_over_many_small_files_are_still_read_once(tmp_path):
    """Files of 7 records, blocks of 20: a block is a piece of each of 3-4 files, a window
    of 2 blocks up to 8 pieces; each piece is still read once in an epoch (what is held is
    bounded by bytes, not by pieces)."""
    paths, every = tfrecord_files(str(tmp_path), count=12, per_file=7)
    src, order = _blocked(paths, tmp_path / "index")
    before = handles.stats()["reads"]
    for start in range(0, len(order), 16):
        indices = order[start : start + 16]
        assert packed_strings(src.read_packed(indices)) == [every[i] for i in indices]
    assert handles.stats()["reads"] - before == len({(i // 7, i // 20) for i in range(84)})


@pytest.mark.parametrize("where", ["data", "length", "length-crc", "data-crc"])
@pytest.mark.parametrize("read", ["read_packed", "read_batch"])
def test_a_corrupt_record_inside_a_held_block_is_named_by_file_and_offset(tmp_path, where, read):
    """A flipped byte of record 7 of file 1 (record 57, in the block of records 40-59 read by
    one pread): the error names the file, the record's number and byte offset as a read
    record by record does; the block's other records read as they are."""
    paths, every = tfrecord_files(str(tmp_path))
    src, _ = _blocked(paths, tmp_path / "index")  # indexed before the byte flips
    first = records(1, 50, 207)
    offset = sum(16 + len(r) for r in first[:7])
    at = {"data": 12 + 3, "length": 2, "length-crc": 9, "data-crc": 16 + len(first[7]) - 2}
    stat = os.stat(paths[1])
    with open(paths[1], "r+b") as out:
        out.seek(offset + at[where])
        byte = out.read(1)
        out.seek(offset + at[where])
        out.write(bytes([byte[0] ^ 0xFF]))
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the checks see it
    indices = np.array([41, 57, 52, 59])
    with pytest.raises(CorruptRecordError) as info:
        getattr(src, read)(indices)
    message = str(info.value)
    assert "part-1.tfrecord, record 7" in message and f"byte offset {offset}" in message
    assert info.value.record_index == 57
    assert (1, 2) in src._held  # the block was read whole, and is held
    before = handles.stats()["reads"]
    got = packed_strings(src.read_packed(np.array([59, 50, 41])))
    assert got == [every[59], every[50], every[41]]
    assert handles.stats()["reads"] == before  # from the blocks held


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("kind", ["held", "runs"])
def test_a_corrupt_data_byte_is_found_at_any_position_of_the_batch(tmp_path, position, kind):
    """A flipped data byte of record 57 (file 1, record 7), first, in the middle or last of
    a packed batch, read from a held block or by runs: the strings made to check the
    records are never handed over; the error names the file, record and byte offset."""
    paths, every = tfrecord_files(str(tmp_path))
    if kind == "held":
        src, _ = _blocked(paths, tmp_path / "index")
    else:
        src = TFRecordSource(paths, index_dir=tmp_path / "index")
    first = records(1, 50, 207)
    offset = sum(16 + len(r) for r in first[:7])
    stat = os.stat(paths[1])
    with open(paths[1], "r+b") as out:
        out.seek(offset + 12 + len(first[7]) // 2)
        byte = out.read(1)
        out.seek(offset + 12 + len(first[7]) // 2)
        out.write(bytes([byte[0] ^ 0x01]))
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the CRC sees it
    others = [44, 58, 3, 51, 120, 59, 56]
    at = {"first": 0, "middle": 3, "last": len(others)}[position]
    indices = np.array([*others[:at], 57, *others[at:]])
    with pytest.raises(CorruptRecordError) as info:
        src.read_packed(indices)
    message = str(info.value)
    assert "part-1.tfrecord, record 7" in message and f"byte offset {offset}" in message
    assert info.value.record_index == 57
    assert packed_strings(src.read_packed(np.array(others))) == [every[i] for i in others]


def test_a_file_cut_short_inside_a_block_is_named(tmp_path):
    """A file truncated after it was indexed: the block's pread comes back short, nothing is
    held, and the record is named as a read record by record names it."""
    paths, _ = tfrecord_files(str(tmp_path))
    src, _ = _blocked(paths, tmp_path / "index")
    with open(paths[2], "r+b") as out:
        out.truncate(os.path.getsize(paths[2]) - 100)
    for read in ("read_packed", "read_batch"):
        with pytest.raises(CorruptRecordError, match=r"part-2\.tfrecord"):
            getattr(src, read)(np.array([121, 149, 125]))
    assert (2, 7) not in src._held


def test_a_copy_in_another_process_holds_nothing_and_reads_the_same(tmp_path):
    """Pickled (a process worker's copy): no block held, the same records; a window too
    large for `HELD_BYTES` reads by runs (nothing held)."""
    paths, every = tfrecord_files(str(tmp_path))
    src, order = _blocked(paths, tmp_path / "index")
    src.read_packed(order[:16])
    again = pickle.loads(pickle.dumps(src))
    assert again._held is not None and src._held is not None
    assert not again._held._blocks and again._held.budget == src._held.budget
    assert packed_strings(again.read_packed(order[:16])) == [every[i] for i in order[:16]]
    huge = TFRecordSource(paths, index_dir=tmp_path / "index").blocked(
        20, window_chunks=tfrecord.HELD_BYTES // (20 * 200))
    assert huge._held is None
    assert packed_strings(huge.read_packed(order[:16])) == [every[i] for i in order[:16]]
