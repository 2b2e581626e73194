"""`ArrayRecordSource`: ArrayRecord files (the `array-record` package, an optional extra).

ArrayRecord keeps an index of its records in each file's footer, so any record can
be read directly; records compressed in groups of one are read without decompressing
their neighbours. A batch is read with one ``ArrayRecordReader.read(indices)`` call
per file it touches (the reader reads them in parallel). Records are the stored bytes
(typically serialized ``tf.train.Example``): parse and decode them in TensorFlow with
`Pipeline.tf_map`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base
from resumeloader.sources import files as files_lib

__all__ = ["ArrayRecordSource"]

# Random access: no read-ahead (see ArrayRecordReader's documentation).
READER_OPTIONS = "readahead_buffer_size:0"
_EDGE_BYTES = 1 << 16


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as err:
        msg = (
            "ArrayRecordSource needs the `array-record` package: "
            "pip install 'resumeloader[arrayrecord]'."
        )
        raise ImportError(msg) from err
    return array_record_module


def _group_size(options: str) -> int:
    for option in options.split(","):
        key, _, value = option.partition(":")
        if key.strip() == "group_size":
            return int(value)
    return 65536  # array-record's default when a writer was not told


def _ends_digest(path: str, size: int) -> str:
    """A hash of the first and last 64 KiB: the first records and the footer's index."""
    with open(path, "rb") as f:
        head = f.read(_EDGE_BYTES)
        f.seek(max(0, size - _EDGE_BYTES))
        return hashlib.blake2b(head + f.read(), digest_size=8).hexdigest()


class ArrayRecordSource(base.Source):
    """ArrayRecord files as a random-access source of stored records (bytes).

    Guarantees: record ``i`` is the ``i``-th record of the files in the order given (a
    glob is sorted), in every process; the files' names, sizes, record counts and
    footers are order fields, so a checkpoint of other files is refused.

    Args:
        paths: a file, a glob pattern, or a list of files and patterns.
        reader_options: the ``ArrayRecordReader`` options (default: no read-ahead,
            for random access).

    Raises:
        ImportError: the `array-record` package is not installed.
        ValueError: a file was written with a group size other than 1: every
            random read would decompress its whole group (rewrite it with
            ``group_size:1``).
    """

    def __init__(
        self,
        paths: files_lib.Paths,
        *,
        reader_options: str = READER_OPTIONS,
    ) -> None:
        module = _module()
        self._paths = files_lib.expand_paths(paths, "ArrayRecord")
        self._options = reader_options
        counts, sizes, tails = [], [], []
        for path in self._paths:
            reader = module.ArrayRecordReader(path, reader_options)
            try:
                written = reader.writer_options_string()
                group = _group_size(written)
                if group != 1:
                    msg = (
                        f"{path} was written with group_size:{group}: its records are "
                        f"compressed in groups of {group}, so each random read would "
                        f"decompress {group} records. Rewrite it with "
                        "ArrayRecordWriter(path, 'group_size:1') for random access. "
                        f"Received writer options: {written!r}."
                    )
                    raise ValueError(msg)
                counts.append(reader.num_records())
            finally:
                reader.close()
            sizes.append(os.path.getsize(path))
            tails.append(_ends_digest(path, sizes[-1]))
        self._ends = np.cumsum(np.array(counts, dtype=np.int64))
        self._starts = self._ends - np.array(counts, dtype=np.int64)
        self._readers: list[Any] | None = None
        self._lock = threading.Lock()
        self.description = files_lib.describe("ArrayRecordSource", self._paths)
        contents = [f"{s}:{c}:{t}" for s, c, t in zip(sizes, counts, tails, strict=True)]
        self._fields: dict[str, int | str] = {
            "num_records": len(self),
            **files_lib.identity(self._paths, contents),
        }

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_readers": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def __len__(self) -> int:
        return int(self._ends[-1])

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of(b"")

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    @property
    def batched(self) -> bool:
        return True

    @property
    def reads_many(self) -> bool:
        return True

    def read(self, index: int) -> bytes:
        return self.read_batch(np.array([index], dtype=np.int64))[0]

    def read_many(self, indices: np.ndarray) -> list[Any]:
        return self.read_batch(indices)

    def read_batch(self, indices: np.ndarray) -> list[bytes]:
        """The records at `indices` (stored bytes), in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            msg = f"Record indices must lie in [0, {len(self)}). Received: {indices.tolist()}."
            raise IndexError(msg)
        files = np.searchsorted(self._ends, indices, side="right")
        local = indices - self._starts[files]
        readers = self._open()
        out: list[bytes] = [b""] * len(indices)
        for file in np.unique(files).tolist():
            where = np.flatnonzero(files == file)
            records = readers[file].read(local[where].tolist())
            for position, record in zip(where.tolist(), records, strict=True):
                out[position] = record
        return out

    def _open(self) -> list[Any]:
        readers = self._readers
        if readers is None:
            with self._lock:
                if self._readers is None:
                    module = _module()
                    self._readers = [
                        module.ArrayRecordReader(path, self._options) for path in self._paths
                    ]
                readers = self._readers
        return readers
