"""What file-backed sources share: expanding paths and globs, and the files' identity.

The identity of a list of files enters the state's order fields (so a checkpoint of
other files is refused, naming what differs): a readable summary of the names, a
digest of every name, and a digest of each file's content layout (its size and what
its own index says). Names are base names, so the same files under another directory
(another mount) are the same data.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["Paths", "expand_paths", "identity"]

Paths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def expand_paths(paths: Paths, kind: str) -> list[str]:
    """The files named by `paths` (a file, a glob, or a list of them; globs sorted).

    Raises:
        FileNotFoundError: a file or pattern names nothing.
        ValueError: `paths` is empty.
    """
    entries = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[str] = []
    for entry in entries:
        entry = os.fspath(entry)
        matched = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
        if not matched:
            msg = f"`paths` pattern {entry!r} matches no file."
            raise FileNotFoundError(msg)
        files += matched
    if not files:
        msg = f"`paths` must name at least one {kind} file. Received: paths={paths!r}."
        raise ValueError(msg)
    for path in files:
        if not os.path.isfile(path):
            msg = f"{kind} file {path!r} does not exist or is not a file."
            raise FileNotFoundError(msg)
    return files


def _digest(parts: list[Any]) -> str:
    return hashlib.blake2b("\n".join(map(str, parts)).encode(), digest_size=8).hexdigest()


def identity(paths: list[str], contents: list[str]) -> dict[str, int | str]:
    """Order fields naming `paths` and their `contents` (one string per file)."""
    names = [os.path.basename(path) for path in paths]
    count = f"{len(names)} file{'s' if len(names) > 1 else ''}"
    span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    return {
        "files": f"{count}: {span}"[:120],
        "names": _digest(names),
        "content": _digest(contents),
    }


def describe(kind: str, paths: list[str]) -> str:
    """E.g. ``TFRecordSource(8 files)``."""
    return f"{kind}({len(paths)} file{'s' if len(paths) > 1 else ''})"
