"""resumeloader: TensorFlow input pipelines that resume at the exact record after a crash.

Store only a position; derive everything else. A `Pipeline` of stages (an index
order, record stages, a batch stage) defines which records land in which batch as a
pure function of (seed, epoch, position); `ResumableLoader` delivers it through
``tf.data`` and keeps a tiny, checkpointable position that the consumer advances.
`IndexSampler` computes the record at any position of any epoch in O(1).

Importing the package does not import TensorFlow: the names that need it
(`ResumableLoader`, `AUTOTUNE`, `restore`) load it on first access, so the sampler, the state
and worker processes stay light. The layers are described in ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from resumeloader import errors
from resumeloader._version import __version__
from resumeloader.core.rng import record_rng
from resumeloader.core.sampler import IndexSampler
from resumeloader.core.shard import Shard
from resumeloader.core.stats import Stats
from resumeloader.errors import (
    ElasticResumeError,
    ErrorBudgetError,
    HarnessError,
    RecordError,
    RecordSpecError,
    ResumeLoaderError,
    ResumeMismatchError,
    StateError,
    StateMismatchError,
    StreamIntegrityError,
    WorkerError,
)
from resumeloader.sources import RandomAccessSource
from resumeloader.stages.pipeline import Pipeline
from resumeloader.workers.options import Workers
from resumeloader.workers.tuning import Tuning

if TYPE_CHECKING:
    from resumeloader.handout.lineage import BatchRecords
    from resumeloader.tfdata.loader import AUTOTUNE, ResumableLoader
    from resumeloader.tfdata.restore import restore
    from resumeloader.workers.dask_backend import DaskOptions

# Public names loaded on first access (their modules import TensorFlow, or the batch
# producer, or a worker backend): name -> module.
_LAZY = {
    "AUTOTUNE": "resumeloader.tfdata.loader",
    "BatchRecords": "resumeloader.handout.lineage",
    "DaskOptions": "resumeloader.workers.dask_backend",
    "ResumableLoader": "resumeloader.tfdata.loader",
    "restore": "resumeloader.tfdata.restore",
}

__all__ = [
    "AUTOTUNE",
    "BatchRecords",
    "DaskOptions",
    "ElasticResumeError",
    "ErrorBudgetError",
    "HarnessError",
    "IndexSampler",
    "Pipeline",
    "RandomAccessSource",
    "RecordError",
    "RecordSpecError",
    "ResumableLoader",
    "ResumeLoaderError",
    "ResumeMismatchError",
    "Shard",
    "StateError",
    "StateMismatchError",
    "Stats",
    "StreamIntegrityError",
    "Tuning",
    "WorkerError",
    "Workers",
    "__version__",
    "errors",
    "record_rng",
    "restore",
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
