"""Sources: random-access record stores and the adapters that read them (no TensorFlow).

`adapt` wraps a user's object (arrays and columns, a Hugging Face dataset, any
``len()`` + ``__getitem__`` object, or a `Source`) in the `Source` interface the
pipeline reads through. File formats: `TFRecordSource`, `ArrayRecordSource` (the
`array-record` extra), read through one bounded cache of open files
(`resumeloader.sources.handles`) or, for objects behind a URL (``s3://``, ``gs://``,
``http(s)://``, ``memory://``), through one storage layer (`resumeloader.sources.storage`,
`resumeloader.sources.fetch`: `ObjectReads`); tfds data sources are `TFDSSource`.
"""

from resumeloader.sources.array_record import ArrayRecordSource
from resumeloader.sources.arrays import ArraySource
from resumeloader.sources.arrow import MissingValueError
from resumeloader.sources.base import (
    CorruptRecordError,
    RandomAccessSource,
    RecordReadError,
    Source,
)
from resumeloader.sources.concat import ConcatSource
from resumeloader.sources.fetch import ObjectChangedError, ObjectReadError, ObjectReads
from resumeloader.sources.file_list import FileSource
from resumeloader.sources.handles import TooManyOpenFiles
from resumeloader.sources.huggingface import HuggingFaceSource
from resumeloader.sources.indexable import IndexableSource
from resumeloader.sources.registry import adapt, register
from resumeloader.sources.tfds import TFDSSource
from resumeloader.sources.tfrecord import TFRecordSource

__all__ = [
    "ArrayRecordSource",
    "ArraySource",
    "ConcatSource",
    "CorruptRecordError",
    "FileSource",
    "HuggingFaceSource",
    "IndexableSource",
    "MissingValueError",
    "ObjectChangedError",
    "ObjectReadError",
    "ObjectReads",
    "RandomAccessSource",
    "RecordReadError",
    "Source",
    "TFDSSource",
    "TFRecordSource",
    "TooManyOpenFiles",
    "adapt",
    "register",
]
