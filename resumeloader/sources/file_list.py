"""`FileSource`: a list or glob of files or objects, each one record (an image folder in a bucket).

Record ``i`` is ``{"path": ..., "data": ...}``: the ``i``-th file's path or URL and its
bytes, the files in the order given (a glob sorted). Decode the bytes in TensorFlow
with `Pipeline.tf_map` (``tf.io.decode_jpeg(batch["data"][k])``...) or in Python with
a ``map_fn``; the path is there for labels (e.g. a class folder). A batch reads every
file it needs at once (`resumeloader.sources.storage.ranges`: objects in parallel,
retried, pinned to each object's version; local files through the bounded cache of
open files, refused if one changed since the source was built).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import file_records
from resumeloader.sources.storage import fetch, locations, options, ranges

__all__ = ["FileSource"]


class FileSource(file_records.FileRecordSource):
    """Files or objects as records ``{"path": str, "data": bytes}``.

    Guarantees: record ``i`` is file ``i`` of the names given (globs sorted), read
    whole, in every process; the files' names and sizes (and objects' versions) are
    order fields, so a checkpoint of other files is refused. A file changed since
    the source was built (size or modification time) or an object of another version
    is refused when read (`CorruptRecordError` naming it), never read as other bytes.

    Args:
        paths: files, URLs (``s3://``, ``gs://``, ``http(s)://``, ``memory://``), globs
            of them, or a list of those.
        storage: where objects are and how they are read (`Storage`).
        storage_options: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(options=...)``.
        object_reads: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(reads=...)``.

    Raises:
        FileNotFoundError: a file, object or pattern names nothing.
    """

    def __init__(
        self,
        paths: locations.Paths,
        *,
        storage: options.Storage | None = None,
        storage_options: Any = None,
        object_reads: Any = None,
    ) -> None:
        storage = options.given(
            storage, "FileSource", storage_options=storage_options, object_reads=object_reads
        )
        super().__init__(paths, storage=storage)

    def _layout(self, file: int) -> file_records.Layout:
        return file_records.Layout(1, str(self._locations[file].size))

    def _data_fields(self) -> dict[str, int | str]:
        fields = super()._data_fields()
        fields.pop("versions", None)
        sizes = [location.size for location in self._locations]
        versions = [getattr(location, "version", "") for location in self._locations]
        fields["identity"] = file_records.content_identity([*sizes, *versions])
        return fields

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of({"path": b"", "data": b""})

    @property
    def paths(self) -> list[str]:
        """Each record's path or URL."""
        return list(self._names)

    def _read(self, files: np.ndarray, numbers: np.ndarray) -> list[dict[str, bytes]]:
        wanted = [(self._locations[file], 0, self._locations[file].size) for file in files.tolist()]
        views = ranges.read(wanted, self._storage.reads, cache=False)
        return [
            {"path": os.fsencode(self._names[file]), "data": bytes(view)}
            for file, view in zip(files.tolist(), views, strict=True)
        ]

    def dry_read(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the GETs and preads that ``read_batch(indices)`` makes: one
        whole object or file per record."""
        files = np.asarray(indices, dtype=np.int64).tolist()
        wanted = [(self._locations[file], 0, self._locations[file].size) for file in files]
        ranges.dry_read(wanted, self._storage.reads, dry, cache=False)
        return True

    def _stack(self, records: list[Any]) -> dict[str, list[bytes]]:
        return {
            "path": [record["path"] for record in records],
            "data": [record["data"] for record in records],
        }
