"""`digest`: a file's or object's whole bytes as a BLAKE2b digest, computed once per version.

What identifies data by its content wherever it is stored (``Storage(identity=
"content")``): the same bytes in another bucket, a local mirror or under another
protocol have the same digest, whatever their URLs and versions. A digest is kept in
the cache folder (``digests/``) under the location's URL or path and its version (an
object) or size and modification time (a local file), so each version is read once
on a machine; a changed file or object is a new key, never a stale digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

from resumeloader.sources.storage import fetch, locations, objects
from resumeloader.sources.storage.options import ObjectReads

__all__ = ["digest"]

_FOLDER = "digests"
_CHUNK = 8 << 20  # bytes hashed at a time (one GET each for an object)


def _key(location: locations.Location) -> str:
    if isinstance(location, objects.Object):
        text = f"{location.url}\n{location.version}\n{location.size}"
    else:
        text = f"{os.path.abspath(location.path)}\n{location.size}\n{location.mtime_ns}"
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _compute(location: locations.Location, reads: ObjectReads) -> str:
    found = hashlib.blake2b(digest_size=16)
    if isinstance(location, objects.Object):
        for start in range(0, location.size, _CHUNK):
            stop = min(start + _CHUNK, location.size)
            (view,) = fetch.read([(location, start, stop)], reads, cache=False)
            found.update(view)
        return found.hexdigest()
    with open(location.path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            found.update(block)
    if locations.LocalFile.of(location.path) != location:
        msg = f"File {location} changed while its digest was computed."
        raise OSError(msg)
    return found.hexdigest()


def digest(location: locations.Location, reads: ObjectReads, folder: str) -> str:
    """The hex BLAKE2b-128 digest of the whole bytes of `location`, kept in `folder`.

    Raises:
        ObjectChangedError: an object is no longer the version it was.
        ObjectReadError, OSError: its bytes could not be read.
    """
    path = os.path.join(folder, _FOLDER, _key(location))
    with contextlib.suppress(OSError):
        with open(path) as f:
            kept = f.read().strip()
        if len(kept) == 32:
            return kept
    found = _compute(location, reads)
    with contextlib.suppress(OSError):  # a folder that cannot be written: computed again
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(found)
        os.replace(tmp, path)
    return found
