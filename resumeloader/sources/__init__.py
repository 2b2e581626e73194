"""Sources: random-access record stores and the adapters that read them (no TensorFlow).

`adapt` wraps a user's object (arrays and columns, a Hugging Face dataset, any
``len()`` + ``__getitem__`` object, or a `Source`) in the `Source` interface the
pipeline reads through; tfds data sources are `TFDSSource`. File formats —
`TFRecordSource`, `ArrayRecordSource` (the `array-record` extra), `FileSource` (a
list of whole files) — share one base (`resumeloader.sources.file_records`) and read
their bytes, from local files or objects behind a URL (``s3://``, ``gs://``,
``http(s)://``, ``memory://``), through the storage package
(`resumeloader.sources.storage`: no record format there), configured by one option
value, `Storage` (with `ObjectReads`).
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
from resumeloader.sources.file_list import FileSource
from resumeloader.sources.huggingface import HuggingFaceSource
from resumeloader.sources.indexable import IndexableSource
from resumeloader.sources.registry import adapt, register
from resumeloader.sources.storage.fetch import ObjectChangedError, ObjectReadError
from resumeloader.sources.storage.handles import TooManyOpenFiles
from resumeloader.sources.storage.options import ObjectReads, Storage
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
    "Storage",
    "TFDSSource",
    "TFRecordSource",
    "TooManyOpenFiles",
    "adapt",
    "register",
]
