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

import glob
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from resumeloader.sources import handles

__all__ = [
    "HEAD_BYTES",
    "Paths",
    "display",
    "expand_paths",
    "head_digest",
    "identity",
    "record_keys",
]

Paths = (
    str | bytes | os.PathLike[str] | os.PathLike[bytes] | Sequence[str | bytes | os.PathLike[str]]
)

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
