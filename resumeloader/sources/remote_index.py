"""The TFRecord index of an object in storage: read once, kept by version, or a sidecar.

Building an index reads the whole object once, from start to end, in ranged GETs of
16 MiB pinned to its version (`resumeloader.sources.storage.fetch`: retried, a changed object
refused). The index is the same compact file as a local file's
(`resumeloader.sources.tfrecord_index`), its header holding the object's size and a
hash of its version instead of a modification time, and it is kept in the local index
folder under a name made of the object's URL, version and size: a new version of the
object is a new index, never a stale one.

A machine that has no index yet looks for a *sidecar* first: the index stored next to
the object, at its URL plus ``.rlidx``, written by ``resumeloader index URL...``
(`write_sidecar`); the sidecars of many objects are found by one listing per folder
(`sidecars`), so building a source costs at most one GET per object (its sidecar, or
the object itself) besides the listings. A sidecar is used only if it is the index of
the object's current version and size and passes the same checks as a local index
(its offsets' digest, a plausible layout); then it is kept locally too. So a fresh
machine restores with one small GET per object instead of reading the bucket.
"""

from __future__ import annotations

import hashlib
import os

from resumeloader.sources import tfrecord_index as index_lib
from resumeloader.sources.storage import fetch, filesystems, locations, objects, ranges
from resumeloader.sources.storage.options import ObjectReads

__all__ = ["SIDECAR_SUFFIX", "build", "cache_path", "load_or_build", "sidecar_url", "write_sidecar"]

#: What a sidecar index adds to its object's URL.
SIDECAR_SUFFIX = ".rlidx"


def stamp(obj: objects.Object) -> int:
    """The 64-bit hash of the object's version that its index's header holds."""
    digest = hashlib.blake2b(obj.version.encode("utf-8", "surrogateescape"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def cache_path(obj: objects.Object, index_dir: str) -> str:
    """Where the index of `obj` (this version) is kept in `index_dir`."""
    key = f"{obj.url}\n{obj.version}\n{obj.size}".encode("utf-8", "surrogateescape")
    name = locations.display(obj.name)[:100]
    digest = hashlib.blake2b(key, digest_size=8).hexdigest()
    return os.path.join(index_dir, f"{name}.{digest}.rlidx")


def sidecar_url(obj: objects.Object) -> str:
    """The URL of `obj`'s sidecar index."""
    return objects.display_url(obj.url) + SIDECAR_SUFFIX


def _index(obj: objects.Object, found: tuple[object, bytes, bytes]) -> index_lib.FileIndex:
    offsets, digest, head = found
    return index_lib.FileIndex(
        obj.url, obj.size, stamp(obj), offsets, digest.hex(), head.hex(), obj  # type: ignore[arg-type]
    )


def build(obj: objects.Object, reads: ObjectReads) -> bytes:
    """The encoded index of `obj`, from one sequential read of it.

    Raises:
        ValueError: the object is not a valid uncompressed TFRecord file.
        ObjectChangedError, ObjectReadError: see `resumeloader.sources.storage.fetch`.
    """
    file = ranges.Sequential(obj, reads)
    head = index_lib.head_digest(file)
    offsets = index_lib.walk(obj.url, file)
    return index_lib.encode(offsets, obj.size, stamp(obj), head)


def kept(obj: objects.Object, index_dir: str) -> bool:
    """Whether `index_dir` holds an index of `obj` (this version; checked when loaded)."""
    return os.path.exists(cache_path(obj, index_dir))


def sidecars(found: list[objects.Object]) -> dict[str, objects.Object]:
    """The sidecar index beside each of `found` that has one, by the object's URL: one
    listing per folder (`objects.companions`), not a look-up per object."""
    return objects.companions(found, SIDECAR_SUFFIX)


def _sidecar(car: objects.Object, reads: ObjectReads) -> bytes | None:
    if car.size < 128:
        return None
    (view,) = fetch.read([(car, 0, car.size)], reads, cache=False)
    return bytes(view)


def load_or_build(
    obj: objects.Object, index_dir: str, reads: ObjectReads, *,
    sidecar: objects.Object | None = None,
) -> index_lib.FileIndex:
    """The index of `obj`: kept locally, else its `sidecar` (one GET; then kept), else
    built from one sequential read of the object (kept)."""
    stored = cache_path(obj, index_dir)
    try:
        with open(stored, "rb") as f:
            found = index_lib.decode(f.read(), obj.size, stamp(obj))
    except OSError:
        found = None
    if found is not None:
        return _index(obj, found)
    data = _sidecar(sidecar, reads) if sidecar is not None else None
    found = index_lib.decode(data, obj.size, stamp(obj)) if data is not None else None
    if found is None:
        data = build(obj, reads)
        found = index_lib.decode(data, obj.size, stamp(obj))
        assert found is not None
    index_lib.store(stored, data)  # type: ignore[arg-type]
    return _index(obj, found)


def write_sidecar(obj: objects.Object, reads: ObjectReads) -> tuple[str, int]:
    """Builds `obj`'s index and writes it next to it; returns (its URL, its records)."""
    data = build(obj, reads)
    found = index_lib.decode(data, obj.size, stamp(obj))
    assert found is not None
    url = sidecar_url(obj)
    fs = filesystems.filesystem(obj.protocol, obj.options)
    fs.pipe_file(objects.strip(obj.protocol, url), data)
    return url, len(found[0])
