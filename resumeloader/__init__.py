"""resumeloader: TensorFlow input pipelines that resume at the exact record after a crash.

Store only a position; derive everything else. `IndexSampler` computes the record at
any position of any epoch in O(1); `ResumableLoader` feeds a `tf.data` pipeline from
it and keeps a tiny, checkpointable position that the consumer advances.
"""

from resumeloader import errors
from resumeloader._batching import record_rng
from resumeloader._loader import AUTOTUNE, ResumableLoader
from resumeloader._sampler import IndexSampler
from resumeloader._source import RandomAccessSource
from resumeloader._version import __version__
from resumeloader.errors import (
    ElasticResumeError,
    RecordError,
    RecordSpecError,
    ResumeLoaderError,
    StateError,
    StateMismatchError,
    WorkerError,
)

__all__ = [
    "AUTOTUNE",
    "ElasticResumeError",
    "IndexSampler",
    "RandomAccessSource",
    "RecordError",
    "RecordSpecError",
    "ResumableLoader",
    "ResumeLoaderError",
    "StateError",
    "StateMismatchError",
    "WorkerError",
    "__version__",
    "errors",
    "record_rng",
]
