"""What each file of a source was, remembered on this machine to name what changed later.

A checkpoint holds one digest of many files' facts (their versions, their content
digests): small, but it cannot say *which* file differs. `remember` keeps each file's
fact in the local cache folder under that digest, so that a later source whose digest
differs can name the files whose facts differ from the checkpoint's (`changes`), when
this machine built a source over the checkpoint's files. Only for better messages:
nothing is refused or accepted because of it, and a folder that cannot be written is
ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

__all__ = ["changes", "remember"]

_FOLDER = "remembered"


def _path(folder: str, kind: str, digest: str) -> str:
    return os.path.join(folder, _FOLDER, kind, f"{os.path.basename(str(digest))}.json")


def remember(folder: str, kind: str, digest: str, facts: dict[str, str]) -> None:
    """Keeps `facts` (file name -> its `kind` of fact) under `digest` in `folder`."""
    path = _path(folder, kind, digest)
    if os.path.exists(path):
        return
    with contextlib.suppress(OSError):  # only for a better message later
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(facts, f)
        os.replace(tmp, path)


def changes(folder: str, kind: str, saved: str, now: dict[str, str]) -> list[str] | None:
    """The files whose `kind` of fact differs between the remembered digest `saved` and
    `now`, in words (``name (was A, is B)``, ``name (not in the checkpoint)``,
    ``name (gone)``); None when this machine does not remember `saved`."""
    try:
        with open(_path(folder, kind, saved)) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    differ = [
        f"{name} ({kind[:-1] if kind.endswith('s') else kind} {old[name] or '?'} in the "
        f"checkpoint, {now[name] or '?'} now)"
        for name in sorted(set(old) & set(now)) if old[name] != now[name]
    ]
    differ += [f"{name} (not in the checkpoint)" for name in sorted(set(now) - set(old))]
    differ += [f"{name} (gone)" for name in sorted(set(old) - set(now))]
    return differ


def listed(items: list[str], most: int = 5) -> str:
    """`items` joined, at most `most` of them and how many more."""
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
