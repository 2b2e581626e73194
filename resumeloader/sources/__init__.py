"""Sources: random-access record stores and the adapters that read them (no TensorFlow).

`adapt` wraps a user's object (arrays and columns, a Hugging Face dataset, any
``len()`` + ``__getitem__`` object, or a `Source`) in the `Source` interface the
pipeline reads through. File formats: `TFRecordSource`, `ArrayRecordSource` (the
`array-record` extra).
"""

from resumeloader.sources.array_record import ArrayRecordSource
from resumeloader.sources.arrays import ArraySource
from resumeloader.sources.base import RandomAccessSource, Source
from resumeloader.sources.concat import ConcatSource
from resumeloader.sources.huggingface import HuggingFaceSource
from resumeloader.sources.indexable import IndexableSource
from resumeloader.sources.registry import adapt, register
from resumeloader.sources.tfrecord import CorruptRecordError, TFRecordSource

__all__ = [
    "ArrayRecordSource",
    "ArraySource",
    "ConcatSource",
    "CorruptRecordError",
    "HuggingFaceSource",
    "IndexableSource",
    "RandomAccessSource",
    "Source",
    "TFRecordSource",
    "adapt",
    "register",
]
