"""Moving a run's data: a checkpoint restored onto the same bytes at another location.

`Storage(identity="content")` identifies the objects by their bytes (a digest of each,
and its size), not by where they are: a checkpoint follows the bytes to another bucket,
a local mirror or another protocol, and is refused, naming the file, when the bytes
differ. The servers are moto's S3 server and fake-gcs-server (`_objstore_fixtures`).
"""

from __future__ import annotations

import warnings

import _objstore
import pytest
from _objstore_fixtures import records

from resumeloader import Pipeline, ResumableLoader, StateMismatchError
from resumeloader.sources import Storage, TFRecordSource

FILES, COUNT, SIZE = 3, 40, 3000  # 120 KB objects: more than the 64 KiB head digest


def _data(tail: bytes = b"") -> dict[str, bytes]:
    """The objects' names and bytes; `tail` replaces the end of the last record of
    part-1 (same sizes, same record layout, same first 64 KiB: other bytes)."""
    out = {}
    for file in range(FILES):
        data = records(file, COUNT, SIZE)
        if file == 1 and tail:
            data[-1] = data[-1][: -len(tail)] + tail
        out[f"part-{file}.tfrecord"] = _objstore.tfrecord_bytes(data)
    return out


def _put(store, data: dict[str, bytes]) -> str:
    folder = store.folder()
    for name, payload in data.items():
        store.put(f"{folder}/{name}", payload)
    return store.url(f"{folder}/part-*.tfrecord")


def _local(folder, data: dict[str, bytes]) -> str:
    folder.mkdir()
    for name, payload in data.items():
        (folder / name).write_bytes(payload)
    return str(folder / "part-*.tfrecord")


def _loader(url, tmp_path, store=None, identity="content", cache="cache"):
    storage = Storage(
        options=store.options if store is not None else (), identity=identity,
        cache_dir=tmp_path / cache,
    )
    src = TFRecordSource(url, index_dir=tmp_path / cache / "index", storage=storage)
    pipeline = Pipeline(src, seed=5).shuffle(chunk_records=10).batch(8)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=1)


def _batches(loader):
    return [batch.numpy().tolist() for batch in loader]


def _saved(loader, steps: int = 4):
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    return loader.get_state()


def test_checkpoint_follows_the_same_bytes_to_another_bucket_a_mirror_and_gcs(
    s3_store, gcs_store, tmp_path
):
    """Saved on S3; restored on another S3 folder, a local mirror and GCS: the rest of the
    epoch is the uninterrupted run's, with no warning."""
    data = _data()
    url = _put(s3_store, data)
    expected = _batches(_loader(url, tmp_path, s3_store))
    state = _saved(_loader(url, tmp_path, s3_store))
    assert "source.digests" in state and "source.versions" not in state
    moved = {
        "another folder": (_put(s3_store, data), s3_store),
        "a local mirror": (_local(tmp_path / "mirror", data), None),
        "gcs": (_put(gcs_store, data), gcs_store),
    }
    for n, (where, (there, store)) in enumerate(moved.items()):
        loader = _loader(there, tmp_path, store, cache=f"cache-{n}")  # another machine's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader.set_state(state)
        assert _batches(loader) == expected[4:], where


def test_mirror_with_other_bytes_is_refused_naming_the_file(s3_store, tmp_path):
    """A mirror whose part-1 has the same size, record layout and first 64 KiB but other
    bytes at its end: refused, naming part-1 and its digests, before any record is read."""
    url = _put(s3_store, _data())
    state = _saved(_loader(url, tmp_path, s3_store))
    mirror = _local(tmp_path / "mirror", _data(tail=b"changed"))
    with pytest.raises(StateMismatchError) as info:
        _loader(mirror, tmp_path).set_state(state)
    message = str(info.value)
    assert "source.digests: checkpoint has" in message
    assert "files whose bytes differ from the checkpoint's: part-1.tfrecord (digest " in message
    assert "part-0" not in message and "part-2" not in message
    assert "source.content" not in message and "source.identity" not in message
    # on a machine that does not remember the checkpoint's files: still refused
    with pytest.raises(StateMismatchError, match="does not remember which"):
        _loader(mirror, tmp_path, cache="elsewhere").set_state(state)


def test_checkpoint_pinned_to_versions_restores_onto_a_mirror_by_content(s3_store, tmp_path):
    """A checkpoint saved with the default identity (object versions): refused by a local
    copy identified by location (naming the way through), restored by one identified by
    content after names, sizes and layouts match (a warning says so)."""
    data = _data()
    url = _put(s3_store, data)
    expected = _batches(_loader(url, tmp_path, s3_store, identity="versions"))
    state = _saved(_loader(url, tmp_path, s3_store, identity="versions"))
    assert "source.versions" in state
    mirror = _local(tmp_path / "mirror", data)
    with pytest.raises(StateMismatchError) as info:
        _loader(mirror, tmp_path, identity="versions").set_state(state)
    assert "Storage(identity='content')" in str(info.value)
    loader = _loader(mirror, tmp_path)
    with pytest.warns(UserWarning, match="only the files' names, sizes and record layouts"):
        loader.set_state(state)
    assert _batches(loader) == expected[4:]


def test_content_identity_reads_each_object_once_per_version(s3_store, tmp_path):
    """The digests are kept: a second source over the same objects reads none of them
    again (the index is kept too); an unknown identity is refused."""
    url = _put(s3_store, _data())
    _loader(url, tmp_path, s3_store)
    s3_store.proxy.clear()
    _loader(url, tmp_path, s3_store)
    assert not s3_store.proxy.requests.get("read")
    with pytest.raises(ValueError, match="`identity` must be one of 'versions', 'content'"):
        Storage(identity="url")
