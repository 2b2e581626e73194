"""What file-backed sources share: naming files (paths and globs) and the files' identity.

Names: a path that names an existing file is that file, even if it holds glob
characters (``shard[1].tfrecord`` is not ``shard1.tfrecord``); otherwise it is a glob
pattern, whose existing leading directories are taken literally too. Any name the
operating system allows is accepted, including bytes that are not UTF-8 (as ``bytes``
paths, or the ``str`` Python makes of them).

Identity: what a list of files contributes to the state's order fields (so that a
checkpoint of other files is refused, naming what differs): a readable summary of
the names, a digest of every name, and a digest of each file's content layout (its
size and what its own index says). Names are base names, so the same files under
another directory (another mount) are the same data. Reading goes through
`resumeloader.sources.handles`.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from resumeloader.sources import handles, storage

__all__ = [
    "HEAD_BYTES",
    "Location",
    "Paths",
    "display",
    "expand_locations",
    "expand_paths",
    "head_digest",
    "identity",
    "record_keys",
]

Paths = (
    str | bytes | os.PathLike[str] | os.PathLike[bytes] | Sequence[str | bytes | os.PathLike[str]]
)
#: A local file's path, or an object in storage.
Location = str | storage.Object

#: How much of each file's start its head digest covers.
HEAD_BYTES = 1 << 16


def display(path: str) -> str:
    """`path` as text a message or a state can hold (undecodable bytes as ``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _glob(pattern: str) -> list[str]:
    """`pattern`'s matches, its longest existing leading directory taken literally."""
    head, parts = pattern, []
    while head and not os.path.isdir(head):
        head, tail = os.path.split(head)
        if not tail:
            break
        parts.append(tail)
    if not parts:
        return []
    literal = glob.escape(head) if head else ""
    return sorted(glob.glob(os.path.join(literal, *reversed(parts))))


def expand_paths(paths: Paths, kind: str) -> list[str]:
    """The files named by `paths` (a file, a glob, or a list of them; globs sorted).

    Raises:
        FileNotFoundError: a file or pattern names nothing.
        ValueError: `paths` is empty.
    """
    single = isinstance(paths, (str, bytes, os.PathLike))
    entries: list[Any] = [paths] if single else list(paths)  # type: ignore[arg-type]
    files: list[str] = []
    for entry in entries:
        entry = os.fsdecode(entry)
        literal = os.path.isfile(entry) or not glob.has_magic(entry)
        matched = [entry] if literal else _glob(entry)
        if not matched:
            msg = f"`paths` pattern {display(entry)!r} matches no file."
            raise FileNotFoundError(msg)
        files += matched
    if not files:
        msg = f"`paths` must name at least one {kind} file. Received: paths={paths!r}."
        raise ValueError(msg)
    for path in files:
        if not os.path.isfile(path):
            msg = f"{kind} file {display(path)!r} does not exist or is not a file."
            raise FileNotFoundError(msg)
    return files


def expand_locations(
    paths: Paths, kind: str, storage_options: storage.Options | None = None
) -> list[Location]:
    """The files and objects `paths` names: local files and globs as `expand_paths`,
    URLs (``s3://``, ``gs://``, ...) and their globs as `storage.expand` (a
    ``file://`` URL is a local path).

    Raises:
        FileNotFoundError: a file, object or pattern names nothing.
        ValueError: `paths` is empty.
    """
    single = isinstance(paths, (str, bytes, os.PathLike))
    entries: list[Any] = [paths] if single else list(paths)  # type: ignore[arg-type]
    if not entries:
        msg = f"`paths` must name at least one {kind} file. Received: paths={paths!r}."
        raise ValueError(msg)
    out: list[Location] = []
    for entry in entries:
        entry = os.fsdecode(entry)
        if storage.is_url(entry):
            out += storage.expand(entry, storage_options)
        else:
            out += expand_paths(storage.local_path(entry), kind)
    return out


def name_of(location: Location) -> str:
    """A location's path or URL."""
    return location.url if isinstance(location, storage.Object) else location


def head_digest(file: handles.File) -> bytes:
    """A 16-byte hash of the first `HEAD_BYTES` of an opened file."""
    head = file.pread(min(file.size, HEAD_BYTES), 0)
    return hashlib.blake2b(head, digest_size=16).digest()


def _digest(parts: list[Any]) -> str:
    text = "\n".join(map(str, parts)).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(text, digest_size=8).hexdigest()


def identity(paths: list[str], contents: list[str]) -> dict[str, int | str]:
    """Order fields naming `paths` and their `contents` (one string per file)."""
    names = [os.path.basename(path) for path in paths]
    count = f"{len(names)} file{'s' if len(names) > 1 else ''}"
    span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    return {
        "files": display(f"{count}: {span}")[:120],
        "names": _digest(names),
        "content": _digest(contents),
    }


def content_identity(parts: list[Any]) -> str:
    """The ``identity`` order field of a source from its files' content digests."""
    return _digest(parts)


def describe(kind: str, paths: list[str]) -> str:
    """E.g. ``TFRecordSource(8 files)``."""
    return f"{kind}({len(paths)} file{'s' if len(paths) > 1 else ''})"


def record_keys(
    paths: list[str], starts: np.ndarray, ends: np.ndarray, indices: np.ndarray
) -> list[dict[str, Any]]:
    """Each index's key in a record space of files: the index, its file, its number there.

    Args:
        paths: the files, in record order.
        starts: the index of each file's first record.
        ends: the index after each file's last record.
        indices: record indices of the space.
    """
    files = np.searchsorted(ends, indices, side="right")
    numbers = np.asarray(indices, dtype=np.int64) - starts[files]
    names = [display(path) for path in paths]
    return [
        {"record": index, "file": names[file], "file_record": number}
        for index, file, number in zip(
            np.asarray(indices).tolist(), files.tolist(), numbers.tolist(), strict=True
        )
    ]


# -- objects' versions, remembered to name what changed -----------------------------------
def versions_digest(locations: list[Location]) -> str:
    """The ``versions`` order field: a digest of each object's version (a local file: "")."""
    return content_identity([getattr(loc, "version", "") for loc in locations])


def remember_versions(folder: str, locations: list[Location]) -> None:
    """Keeps the objects' URLs and versions in `folder`, under their `versions_digest`,
    so that a later source can name the objects a checkpoint's versions differ in."""
    path = os.path.join(folder, "versions", f"{versions_digest(locations)}.json")
    if os.path.exists(path):
        return
    entries = {name_of(loc): getattr(loc, "version", "") for loc in locations}
    with contextlib.suppress(OSError):  # only for a better message later
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, path)


def changed_versions(folder: str, saved: str, locations: list[Location]) -> str | None:
    """The objects whose versions differ from those of `versions` digest `saved`, in
    words, if this machine remembers that digest (`remember_versions`); else None."""
    try:
        with open(os.path.join(folder, "versions", f"{os.path.basename(saved)}.json")) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    now = {name_of(loc): getattr(loc, "version", "") for loc in locations}
    changed = [
        f"{name} (version {old[name] or '?'} in the checkpoint, {now[name] or '?'} now)"
        for name in sorted(set(old) & set(now)) if old[name] != now[name]
    ]
    changed += [f"{name} (not in the checkpoint)" for name in sorted(set(now) - set(old))]
    changed += [f"{name} (gone)" for name in sorted(set(old) - set(now))]
    if not changed:
        return None
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return f"objects changed since the checkpoint: {shown}"
