"""The files of a `ResumeCallback` checkpoint on the JAX and PyTorch backends: names only.

``DIRECTORY/ckpt-N/`` holds ``loader.json`` (the loader state), ``fit.json`` (the fit
state and what the arrays are) and ``variables.npz``; a save in progress is a hidden
``.ckpt-N.partial-PID`` directory (`resumeloader.integrations.checkpoint_files`
writes them). Kept apart from the writer so that ``resumeloader inspect`` and
``show`` read a loader state without importing Keras or TensorFlow.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "ARRAYS_FILE",
    "FIT_FILE",
    "FORMAT",
    "LOADER_FILE",
    "PARTIAL",
    "checkpoints",
    "loader_file",
]

#: The format version in ``fit.json``.
FORMAT = 1
LOADER_FILE, FIT_FILE, ARRAYS_FILE = "loader.json", "fit.json", "variables.npz"
#: In the name of a checkpoint directory being written.
PARTIAL = ".partial-"
_NAME = re.compile(r"ckpt-(\d+)")


def checkpoints(directory: str) -> list[tuple[int, str]]:
    """The complete checkpoints in `directory`, as (number, path), oldest first."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), os.path.join(directory, n))
             for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found)


def loader_file(path: str) -> str | None:
    """The loader state file of the checkpoint at `path` (a ``ckpt-N`` directory, or a
    directory of them: the newest), or None when `path` is no such checkpoint."""
    if os.path.isfile(os.path.join(path, LOADER_FILE)):
        return os.path.join(path, LOADER_FILE)
    found = checkpoints(path)
    return os.path.join(found[-1][1], LOADER_FILE) if found else None
