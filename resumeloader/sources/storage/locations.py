"""Naming what a file source reads: local files and objects, from paths, URLs and globs.

A *location* is a `LocalFile` (a path, with the size and modification time it had when
the source was built: what it must still have when read) or an `Object` in storage
(a URL, with its size and version: `resumeloader.sources.storage.objects`).

Names: a path that names an existing file is that file, even if it holds glob
characters (``shard[1].tfrecord`` is not ``shard1.tfrecord``); otherwise it is a glob
pattern, whose existing leading directories are taken literally too. Any name the
operating system allows is accepted, including bytes that are not UTF-8 (as ``bytes``
paths, or the ``str`` Python makes of them). URLs (``s3://``, ``gs://``,
``http(s)://``, ``memory://``) and their globs are objects; a ``file://`` URL is a
local path.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Sequence
from typing import Any

from resumeloader.sources.storage import objects

__all__ = [
    "LocalFile",
    "Location",
    "Paths",
    "display",
    "expand",
    "expand_beside",
    "expand_paths",
    "name_of",
]

Paths = (
    str | bytes | os.PathLike[str] | os.PathLike[bytes] | Sequence[str | bytes | os.PathLike[str]]
)


def display(path: str) -> str:
    """`path` as text a message or a state can hold (undecodable bytes as ``\\xff``)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@dataclasses.dataclass(frozen=True)
class LocalFile:
    """A local file as it was when the source was built.

    Attributes:
        path: its path.
        size: its length in bytes.
        mtime_ns: its modification time (ns).
    """

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str) -> LocalFile:
        """`path` as it is now."""
        stat = os.stat(path)
        return cls(path, stat.st_size, stat.st_mtime_ns)

    @property
    def stamp(self) -> tuple[int, int]:
        """(size, modification time): what the file must still have when it is read."""
        return self.size, self.mtime_ns

    @property
    def name(self) -> str:
        """The file's base name (what identifies it in the order fields)."""
        return os.path.basename(self.path)

    def __str__(self) -> str:
        return display(self.path)


#: A local file, or an object in storage.
Location = LocalFile | objects.Object


def name_of(location: Location) -> str:
    """A location's path or URL."""
    return location.url if isinstance(location, objects.Object) else location.path


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


def _entries(paths: Paths, kind: str) -> list[str]:
    single = isinstance(paths, (str, bytes, os.PathLike))
    entries: list[Any] = [paths] if single else list(paths)  # type: ignore[arg-type]
    if not entries:
        msg = f"`paths` must name at least one {kind} file. Received: paths={paths!r}."
        raise ValueError(msg)
    return [os.fsdecode(entry) for entry in entries]


def expand_paths(paths: Paths, kind: str) -> list[str]:
    """The local files named by `paths` (a file, a glob, or a list of them; globs sorted).

    Raises:
        FileNotFoundError: a file or pattern names nothing.
        ValueError: `paths` is empty.
    """
    files: list[str] = []
    for entry in _entries(paths, kind):
        literal = os.path.isfile(entry) or not glob.has_magic(entry)
        matched = [entry] if literal else _glob(entry)
        if not matched:
            msg = f"`paths` pattern {display(entry)!r} matches no file."
            raise FileNotFoundError(msg)
        files += matched
    for path in files:
        if not os.path.isfile(path):
            msg = f"{kind} file {display(path)!r} does not exist or is not a file."
            raise FileNotFoundError(msg)
    return files


def expand(
    paths: Paths, kind: str, options: tuple[tuple[str, Any], ...] = ()
) -> list[Location]:
    """The files and objects `paths` names: local files and globs as `expand_paths`,
    URLs and their globs as `objects.expand` (sizes and versions from the listings;
    `options` are the filesystem's).

    Raises:
        FileNotFoundError: a file, object or pattern names nothing.
        PermissionError: the store refused a listing or a look-up (401/403).
        ValueError: `paths` is empty.
    """
    return expand_beside(paths, kind, options)[0]


def expand_beside(
    paths: Paths, kind: str, options: tuple[tuple[str, Any], ...] = (), suffix: str = ""
) -> tuple[list[Location], dict[str, objects.Object | None]]:
    """`expand`'s locations, and what sits beside the objects of globs (their URL +
    `suffix`, or None) from the same listings (`objects.listed`)."""
    out: list[Location] = []
    beside: dict[str, objects.Object | None] = {}
    for entry in _entries(paths, kind):
        if objects.is_url(entry):
            found, near = objects.listed(entry, options, suffix)
            out += found
            beside.update(near)
        else:
            out += [LocalFile.of(path) for path in expand_paths(objects.local_path(entry), kind)]
    return out, beside
