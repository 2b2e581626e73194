"""The worker backends by kind: the one place a `Workers.kind` becomes a backend.

A backend is a module of this package with a class that follows
`resumeloader.workers.backend.Backend`; its entry here is ``kind: "module:Class"``,
imported on first use (a backend's optional packages load only when it is chosen).
No TensorFlow here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from resumeloader.workers import backend

__all__ = ["BACKENDS", "backend_class"]

BACKENDS: dict[str, str] = {
    "inline": "resumeloader.workers.inline:InlineBackend",
    "thread": "resumeloader.workers.threads:ThreadBackend",
    "process": "resumeloader.workers.process_backend:ProcessBackend",
    "dask": "resumeloader.workers.dask_backend:DaskBackend",
    "auto": "resumeloader.workers.auto_backend:AutoBackend",
}


def backend_class(kind: str) -> type[backend.Backend]:
    """The backend class registered under `kind`.

    Raises:
        ValueError: no backend is registered under `kind`.
    """
    where = BACKENDS.get(kind) if isinstance(kind, str) else None
    if where is None:
        msg = (
            f"`kind` must be one of {', '.join(map(repr, BACKENDS))}. "
            f"Received: kind={kind!r:.80}."
        )
        raise ValueError(msg)
    module, name = where.split(":")
    cls: type[backend.Backend] = getattr(importlib.import_module(module), name)
    return cls
