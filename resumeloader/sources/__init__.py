"""Sources: random-access record stores and the adapters that read them (no TensorFlow).

`adapt` wraps a user's object (arrays, any ``len()`` + ``__getitem__`` object, or a
`Source`) in the `Source` interface the pipeline reads through.
"""

from resumeloader.sources.arrays import ArraySource
from resumeloader.sources.base import RandomAccessSource, Source
from resumeloader.sources.indexable import IndexableSource
from resumeloader.sources.registry import adapt, register
from resumeloader.sources.tfrecord import CorruptRecordError, TFRecordSource

__all__ = [
    "ArraySource",
    "CorruptRecordError",
    "IndexableSource",
    "RandomAccessSource",
    "Source",
    "TFRecordSource",
    "adapt",
    "register",
]
