"""`FileSource`: a list or glob of files or objects, each one record (an image folder in a bucket).

Record ``i`` is ``{"path": ..., "data": ...}``: the ``i``-th file's path or URL and its
bytes, the files in the order given (a glob sorted). Decode the bytes in TensorFlow
with `Pipeline.tf_map` (``tf.io.decode_jpeg(batch["data"][k])``...) or in Python with
a ``map_fn``; the path is there for labels (e.g. a class folder). A batch reads every
object it needs at once (`resumeloader.sources.fetch`: in parallel, retried, pinned to
each object's version) and every local file through `resumeloader.sources.handles`
(refused if it changed since the source was built).
"""

from __future__ import annotations

import os

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base, fetch, handles, storage
from resumeloader.sources import files as files_lib

__all__ = ["FileSource"]


class FileSource(base.Source):
    """Files or objects as records ``{"path": str, "data": bytes}``.

    Guarantees: record ``i`` is file ``i`` of the names given (globs sorted), read
    whole, in every process; the files' names and sizes (and objects' versions) are
    order fields, so a checkpoint of other files is refused. A file changed since
    the source was built (size or modification time) or an object of another version
    is refused when read (`CorruptRecordError` naming it), never read as other bytes.

    Args:
        paths: files, URLs (``s3://``, ``gs://``, ``http(s)://``, ``memory://``), globs
            of them, or a list of those.
        storage_options: keyword arguments of the objects' fsspec filesystem.
        object_reads: how objects are read (`ObjectReads`).

    Raises:
        FileNotFoundError: a file, object or pattern names nothing.
    """

    def __init__(
        self,
        paths: files_lib.Paths,
        *,
        storage_options: storage.Options | None = None,
        object_reads: fetch.ObjectReads | None = None,
    ) -> None:
        self._locations = files_lib.expand_locations(paths, "data", storage_options)
        self._names = [files_lib.name_of(location) for location in self._locations]
        self._reads = object_reads if object_reads is not None else fetch.ObjectReads()
        stamps: list[handles.Stamp | None] = []
        sizes = []
        for location in self._locations:
            if isinstance(location, storage.Object):
                stamps.append(None)
                sizes.append(location.size)
            else:
                stat = os.stat(location)
                stamps.append((stat.st_size, stat.st_mtime_ns))
                sizes.append(stat.st_size)
        self._stamps, self._sizes = stamps, sizes
        self.description = files_lib.describe("FileSource", self._names)
        versions = [getattr(loc, "version", "") for loc in self._locations]
        self._fields: dict[str, int | str] = {
            "num_records": len(self._locations),
            **files_lib.identity(self._names, [str(size) for size in sizes]),
            "identity": files_lib.content_identity([*sizes, *versions]),
        }

    def __len__(self) -> int:
        return len(self._locations)

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of({"path": b"", "data": b""})

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    def mean_record_bytes(self) -> float:
        return sum(self._sizes) / max(1, len(self))

    @property
    def paths(self) -> list[str]:
        """Each record's path or URL."""
        return list(self._names)

    @property
    def batched(self) -> bool:
        return True

    def read(self, index: int) -> dict[str, bytes]:
        batch = self.read_batch(np.array([index], dtype=np.int64))
        return {"path": batch["path"][0], "data": batch["data"][0]}

    def read_batch(self, indices: np.ndarray) -> dict[str, list[bytes]]:
        """The records at `indices`: their paths and bytes, as lists."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            msg = f"Record indices must lie in [0, {len(self)}). Received: {indices.tolist()}."
            raise IndexError(msg)
        at = indices.tolist()
        data: list[bytes] = [b""] * len(at)
        remote = [k for k, i in enumerate(at) if isinstance(self._locations[i], storage.Object)]
        if remote:
            ranges = [(self._locations[at[k]], 0, self._sizes[at[k]]) for k in remote]
            try:
                views = fetch.read(ranges, self._reads, cache=False)
            except (fetch.ObjectChangedError, fetch.ObjectReadError) as err:
                index = next(at[k] for k in remote if self._names[at[k]] in str(err))
                msg = f"Record index {index}: {err}"
                if isinstance(err, fetch.ObjectChangedError):
                    raise base.CorruptRecordError(msg, record_index=index) from err
                raise base.RecordReadError(msg, record_index=index) from err
            for k, view in zip(remote, views, strict=True):
                data[k] = bytes(view)
        for k, index in enumerate(at):
            location = self._locations[index]
            if isinstance(location, str):
                size, stamp = self._sizes[index], self._stamps[index]
                try:
                    data[k] = handles.pread(location, size, 0, stamp=stamp)
                except handles.StaleFileError as err:
                    msg = f"Record index {index}: {err}"
                    raise base.CorruptRecordError(msg, record_index=index) from err
        paths = [os.fsencode(self._names[i]) for i in at]
        return {"path": paths, "data": data}

    def dry_read(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the GETs and preads that ``read_batch(indices)`` makes: one
        whole object or file per record."""
        at = np.asarray(indices, dtype=np.int64).tolist()
        remote = [i for i in at if isinstance(self._locations[i], storage.Object)]
        if remote:
            ranges = [(self._locations[i], 0, self._sizes[i]) for i in remote]
            dry.read(ranges, self._reads, cache=False)
        for i in at:
            if isinstance(self._locations[i], str):
                dry.pread(self._locations[i], 0, self._sizes[i])
        return True
