"""The file-format base, the `Storage` option value and capabilities as optional methods.

A new format is one subclass of `FileRecordSource` defining `_layout` and `_read`: the
JSON-lines format below is the whole of one, and gets names, order fields, lineage,
errors and objects from the base. No TensorFlow, no server (``memory://`` objects).
"""

from __future__ import annotations

import copy
import json
import pickle
import warnings

import _objstore
import numpy as np
import pytest

from resumeloader.sources import (
    ConcatSource,
    CorruptRecordError,
    FileSource,
    IndexableSource,
    ObjectReads,
    Storage,
    TFRecordSource,
    base,
    file_records,
)
from resumeloader.sources.storage import filesystems, ranges


class JsonLines(file_records.FileRecordSource):
    """A format in a dozen lines: one JSON document per line."""

    kind = "JSON-lines"

    def __init__(self, paths, *, storage=None):
        super().__init__(paths, storage=storage or Storage())

    def _layout(self, file):
        location = self._locations[file]
        data = ranges.Sequential(location, self._storage.reads).pread(location.size, 0)
        ends = [at + 1 for at, byte in enumerate(data) if byte == 10]
        starts = [0, *ends[:-1]] if ends else []
        return file_records.Layout(len(starts), f"{location.size}:{len(starts)}", data=starts)

    def _read(self, files, numbers):
        wanted = []
        for file, number in zip(files.tolist(), numbers.tolist(), strict=True):
            starts = self._layouts[file].data
            stop = starts[number + 1] if number + 1 < len(starts) else self._locations[file].size
            wanted.append((self._locations[file], starts[number], stop))
        return [json.loads(bytes(view)) for view in ranges.read(wanted, self._storage.reads)]


def _lines(rows):
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_file_record_source_subclass_reads_local_files_and_objects_alike(tmp_path):
    """A format defining only `_layout` and `_read` reads files and objects, in order."""
    (tmp_path / "a.jsonl").write_bytes(_lines([{"i": 0}, {"i": 1}]))
    filesystems.filesystem("memory").pipe_file("/rl-fr/b.jsonl", _lines([{"i": 2}]))
    source = JsonLines([str(tmp_path / "a.jsonl"), "memory://rl-fr/b.jsonl"])
    assert len(source) == 3 and source.read_many(np.array([2, 0])) == [{"i": 2}, {"i": 0}]
    assert source.records_per_file() == [2, 1]
    assert source.order_fields()["files"] == "2 files: a.jsonl .. b.jsonl"
    assert "versions" in source.order_fields()  # an object is pinned to its version
    assert source.record_key(2)["file"] == "memory://rl-fr/b.jsonl"


def test_file_record_source_changed_file_is_refused_naming_the_record(tmp_path):
    """A file rewritten after the source was built: CorruptRecordError with its index."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(_lines([{"i": 0}, {"i": 1}]))
    source = JsonLines(str(path))
    path.write_bytes(_lines([{"i": 5}, {"i": 6}, {"i": 7}]))
    with pytest.raises(CorruptRecordError, match="changed since it was indexed") as info:
        source.read(1)
    assert info.value.record_index == 1 and str(path) in str(info.value)


@pytest.mark.parametrize("kind", ["tfrecord", "object"], ids=["local-tfrecord", "memory-object"])
def test_file_record_source_without_records_names_the_file(tmp_path, kind):
    """An empty file (or object) as the whole source: a ValueError naming it."""
    if kind == "tfrecord":
        path = str(tmp_path / "empty.tfrecord")
        open(path, "wb").close()
    else:
        filesystems.filesystem("memory").pipe_file("/rl-fr/empty.tfrecord", b"")
        path = "memory://rl-fr/empty.tfrecord"
    with pytest.raises(ValueError, match="holds no record") as info:
        TFRecordSource(path, index_dir=tmp_path / "ix")
    assert "empty.tfrecord (0 bytes)" in str(info.value)


def test_storage_keeps_options_sorted_and_checks_its_fields():
    """`Storage` freezes its options as sorted pairs and refuses what is not an option."""
    assert Storage(options={"b": 1, "a": 2}).options == (("a", 2), ("b", 1))
    with pytest.raises(TypeError, match="`reads` must be an ObjectReads"):
        Storage(reads={"concurrency": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`options` must be a mapping"):
        Storage(options=["endpoint"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="copies_bytes"):
        Storage(copies_bytes=-1)


def test_source_keywords_of_0_3_still_work_with_a_deprecation_warning(tmp_path):
    """`storage_options=` / `object_reads=` become a `Storage` and warn, naming it."""
    path = tmp_path / "a.tfrecord"
    path.write_bytes(_objstore.tfrecord_bytes([b"x", b"y"]))
    reads = ObjectReads(concurrency=3)
    with pytest.warns(DeprecationWarning, match=r"storage=Storage\(reads=...\)"):
        source = TFRecordSource(str(path), index_dir=tmp_path / "ix", object_reads=reads)
    assert source.read(1) == b"y"
    with pytest.raises(TypeError, match="not both"):
        FileSource(str(path), storage=Storage(), object_reads=reads)


def test_capabilities_are_the_methods_a_source_has(tmp_path):
    """`optional` finds `read_batch`/`read_many`/`prefetch` only where a source has them;
    a removed one stays removed through copies and pickles."""

    class Plain:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.int64(i)

    class Batched(Plain):
        def read_batch(self, indices):
            return np.asarray(indices)

    plain, batched = IndexableSource(Plain()), IndexableSource(Batched())
    assert base.optional(plain, "read_batch") is None and base.optional(plain, "read_many") is None
    assert base.optional(batched, "read_batch") is not None
    assert base.optional(ConcatSource({"a": plain, "b": batched}), "read_batch") is None
    path = tmp_path / "a.tfrecord"
    path.write_bytes(_objstore.tfrecord_bytes([b"x"]))
    local = TFRecordSource(str(path), index_dir=tmp_path / "ix")
    assert base.optional(local, "prefetch") is None  # nothing in object storage
    for again in (copy.copy(local), pickle.loads(pickle.dumps(local)), local.blocked(4)):
        assert base.optional(again, "prefetch") is None and again.read(0) == b"x"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert base.optional(local, "read_batch")(np.array([0])) == [b"x"]
