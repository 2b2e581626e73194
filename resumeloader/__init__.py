"""resumeloader: TensorFlow input pipelines that resume at the exact record after a crash.

Store only a position; derive everything else. `IndexSampler` computes the record at
any position of any epoch in O(1); `ResumableLoader` feeds a `tf.data` pipeline from
it and keeps a tiny, checkpointable position that the consumer advances.

Importing the package does not import TensorFlow: the names that need it
(`ResumableLoader`, `AUTOTUNE`) load it on first access, so the sampler, the state
and worker processes stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from resumeloader import errors
from resumeloader._batching import record_rng
from resumeloader._sampler import IndexSampler
from resumeloader._source import RandomAccessSource
from resumeloader._version import __version__
from resumeloader.errors import (
    ElasticResumeError,
    HarnessError,
    RecordError,
    RecordSpecError,
    ResumeLoaderError,
    ResumeMismatchError,
    StateError,
    StateMismatchError,
    WorkerError,
)

if TYPE_CHECKING:
    from resumeloader._loader import AUTOTUNE, ResumableLoader

# Public names whose modules import TensorFlow: name -> module.
_LAZY = {
    "AUTOTUNE": "resumeloader._loader",
    "ResumableLoader": "resumeloader._loader",
}

__all__ = [
    "AUTOTUNE",
    "ElasticResumeError",
    "HarnessError",
    "IndexSampler",
    "RandomAccessSource",
    "RecordError",
    "RecordSpecError",
    "ResumableLoader",
    "ResumeLoaderError",
    "ResumeMismatchError",
    "StateError",
    "StateMismatchError",
    "WorkerError",
    "__version__",
    "errors",
    "record_rng",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    msg = f"module 'resumeloader' has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
