"""`FileRecordSource`: what every file format shares, so that a format says only what is its own.

A file format (TFRecord, ArrayRecord, a list of whole files; Parquet would be one
more module) subclasses `FileRecordSource` and defines two methods:

* ``_layout(file)``: how many records file number `file` holds and what identifies its
  content (a `Layout`), read through `resumeloader.sources.storage`; called once per
  file when the source is built (several files at once, in threads);
* ``_read(files, numbers)``: record ``numbers[k]`` of file ``files[k]`` for each ``k``,
  in that order.

The base does the rest, the same way for every format: it names the files and objects
(paths, URLs, globs: `resumeloader.sources.storage.locations`) and takes the storage
options (`Storage`); lays the files' records end to end (record ``i`` is record ``i -
start`` of its file); builds the order fields that identify the data (`files`,
`names`, `content`, the format's `identity` when it has one, and the objects'
`versions`); refuses files that hold no record, naming them; names the record a
storage failure is about (`CorruptRecordError` for a file or object that changed,
`RecordReadError` for one that could not be read); gives lineage keys (file and
record in it), the block order's facts (records per file, bytes per record) and the
explanation of a field a checkpoint disagrees on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from concurrent import futures
from typing import Any, ClassVar

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base
from resumeloader.sources.storage import (
    answers,
    digests,
    fetch,
    handles,
    locations,
    objects,
    options,
    remembered,
)

__all__ = ["FileRecordSource", "Layout", "content_identity", "describe", "identity"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """One file as its format sees it when the source is built.

    Attributes:
        records: how many records it holds.
        content: what identifies its content in the ``content`` order field (its size
            and record layout, as the format knows them).
        digest: its part of the ``identity`` order field (a digest of its bytes), or
            None when the format has no identity of its own.
        data: what the format keeps of it (e.g. a TFRecord offset index).
    """

    records: int
    content: str
    digest: str | None = None
    data: Any = None


def _digest(parts: list[Any]) -> str:
    text = "\n".join(map(str, parts)).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(text, digest_size=8).hexdigest()


def identity(paths: list[str], contents: list[str]) -> dict[str, int | str]:
    """Order fields naming `paths` (by base name: the same files under another folder
    are the same data) and their `contents` (one string per file)."""
    names = [os.path.basename(path) for path in paths]
    count = f"{len(names)} file{'s' if len(names) > 1 else ''}"
    span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"
    return {
        "files": locations.display(f"{count}: {span}")[:120],
        "names": _digest(names),
        "content": _digest(contents),
    }


def content_identity(parts: list[Any]) -> str:
    """The ``identity`` order field of a source from its files' content digests."""
    return _digest(parts)


def describe(kind: str, paths: list[str]) -> str:
    """E.g. ``TFRecordSource(8 files)``."""
    return f"{kind}({len(paths)} file{'s' if len(paths) > 1 else ''})"


class FileRecordSource(base.Source):
    """Records stored in files or objects, read through `resumeloader.sources.storage`.

    Guarantees: record ``i`` is record ``i - start`` of the file it falls in, the files
    in the order given (a glob sorted), in every process; the files' names and content
    (and the format's identity) are order fields, so a checkpoint of other files is
    refused, naming what differs. A file or object that changed since the source was
    built is refused when read (`CorruptRecordError` naming it), never read as other
    bytes.

    Subclasses set `kind` (how messages name a file: ``"TFRecord"``) and define
    `_layout` and `_read` (see the module docstring); they may override `_identity`
    and `_stack` (how a batch of records is returned), and set `_keep_dir` (where
    facts about the files are remembered for messages) and `companion` (what sits
    beside each object, found by the same listings: ``_beside[url]`` is it or None, for
    the objects a listing found).
    """

    #: How messages name one of the files (``"TFRecord"`` file).
    kind: ClassVar[str] = "data"
    #: What the format keeps beside an object (its URL + this: e.g. a sidecar index),
    #: found by the same listings as the objects (`_beside`), or "" for nothing.
    companion: ClassVar[str] = ""

    def __init__(self, paths: locations.Paths, *, storage: options.Storage) -> None:
        self._storage = storage
        self._locations, self._beside = locations.expand_beside(
            paths, self.kind, storage.pairs, self.companion
        )
        self._names = [locations.name_of(location) for location in self._locations]
        self.description = describe(type(self).__name__, self._names)
        self._remote = np.array([isinstance(loc, objects.Object) for loc in self._locations])
        self._prepare()
        count = len(self._locations)
        with futures.ThreadPoolExecutor(max(1, min(storage.reads.concurrency, count))) as pool:
            self._layouts = list(pool.map(self._layout, range(count)))
        counts = np.array([layout.records for layout in self._layouts], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        if not self._ends[-1]:
            self._refuse_empty()
        self._digests: list[str] = []
        if storage.identity == "content":  # each file's whole bytes, read once per version
            with futures.ThreadPoolExecutor(max(1, min(storage.reads.concurrency, count))) as pool:
                self._digests = list(pool.map(self._digest_of, range(count)))
        self._fields = self._data_fields()
        if "versions" in self._fields:
            remembered.remember(self._keep_dir, "versions", self._versions(), self._facts())
        if "digests" in self._fields:
            remembered.remember(
                self._keep_dir, "digests", str(self._fields["digests"]), self._content_facts()
            )

    # -- what a format defines ----------------------------------------------------------
    def _prepare(self) -> None:
        """What the format finds about all its files at once, before `_layout` of each
        (e.g. the sidecars of many objects, by one listing). Default: nothing."""

    def _layout(self, file: int) -> Layout:
        """How file number `file` holds its records (see `Layout`)."""
        raise NotImplementedError

    def _read(self, files: np.ndarray, numbers: np.ndarray) -> list[Any]:
        """Record ``numbers[k]`` of file ``files[k]`` for each ``k``, in that order.

        Raises:
            StaleFileError, ObjectChangedError, ObjectReadError: storage failed (the
                base names the record); or the record errors of `base`.
        """
        raise NotImplementedError

    def _identity(self) -> str | None:
        """The ``identity`` order field: a digest of the files' `Layout.digest`, or None
        when the format has none."""
        digests = [layout.digest for layout in self._layouts]
        return None if None in digests else content_identity(digests)

    def _data_fields(self) -> dict[str, int | str]:
        """The order fields: the record count, the files' names and content, the
        format's identity, the objects' versions."""
        fields: dict[str, int | str] = {
            "num_records": int(self._ends[-1]),
            **identity(self._names, [layout.content for layout in self._layouts]),
        }
        found = self._identity()
        if found is not None:
            fields[base.IDENTITY] = found
        if self._digests:  # identified by content: each file's size and bytes
            fields["digests"] = content_identity([
                f"{loc.size}:{found}" for loc, found in zip(
                    self._locations, self._digests, strict=True)
            ])
        elif self._remote.any():  # objects: each one's version
            fields["versions"] = self._versions()
        return fields

    def _stack(self, records: list[Any]) -> Any:
        """`read_batch`'s form of `records` (default: the list)."""
        return records

    @property
    def _keep_dir(self) -> str:
        """Where facts about the files are remembered (to name what changed later)."""
        return self._storage.folder

    # -- the record space ----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._ends[-1])

    def record_spec(self) -> spec_lib.RecordSpec:
        return spec_lib.RecordSpec.of(b"")

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    def record_key(self, index: int) -> dict[str, Any]:
        """The record's index, its file and its number in that file."""
        return self.record_keys(np.asarray([index], dtype=np.int64))[0]

    def record_keys(self, indices: np.ndarray) -> list[dict[str, Any]]:
        """`record_key` of each of `indices`."""
        files = np.searchsorted(self._ends, indices, side="right")
        numbers = np.asarray(indices, dtype=np.int64) - self._starts[files]
        names = [locations.display(name) for name in self._names]
        return [
            {"record": index, "file": names[file], "file_record": number}
            for index, file, number in zip(
                np.asarray(indices).tolist(), files.tolist(), numbers.tolist(), strict=True
            )
        ]

    def records_per_file(self) -> list[int] | None:
        """How many records each file holds, in order."""
        return (self._ends - self._starts).tolist()

    def mean_record_bytes(self) -> float:
        """The files' bytes per record."""
        return sum(location.size for location in self._locations) / max(1, len(self))

    # -- reading -------------------------------------------------------------------------
    def read(self, index: int) -> Any:
        return self._records(np.array([index], dtype=np.int64))[0]

    def read_many(self, indices: np.ndarray) -> list[Any]:
        """The records at `indices`, in that order."""
        return self._records(indices)

    def read_batch(self, indices: np.ndarray) -> Any:
        """The records at `indices`, in that order (a list of bytes for a format of bytes)."""
        return self._stack(self._records(indices))

    def _records(self, indices: np.ndarray) -> list[Any]:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            msg = f"Record indices must lie in [0, {len(self)}). Received: {indices.tolist()}."
            raise IndexError(msg)
        files = np.searchsorted(self._ends, indices, side="right")
        numbers = indices - self._starts[files]
        try:
            return self._read(files, numbers)
        except (handles.StaleFileError, fetch.ObjectReadError, answers.Refusal) as err:
            at = self._failing(err, files)
            raise self._failed(files[at], numbers[at], err) from err

    def _failing(self, err: BaseException, files: np.ndarray) -> int:
        """The position (in `files`) of the first record whose file `err` names."""
        url = getattr(err, "url", None)
        for at, file in enumerate(files.tolist()):
            if self._names[file] == url:
                return at
        for at, file in enumerate(files.tolist()):
            if objects.display_url(self._names[file]) in str(err):
                return at
        return 0

    def _failed(
        self, file: Any, number: Any, err: BaseException
    ) -> base.CorruptRecordError | base.RecordReadError:
        """The record error of record `number` of `file` that `err` (a storage failure)
        is about: corrupt when the file changed, unreadable otherwise (a refusal, a failed
        read)."""
        index = int(self._starts[int(file)] + number)
        if not isinstance(err, handles.StaleFileError):
            return base.RecordReadError(f"Record index {index}: {err}", record_index=index)
        return base.CorruptRecordError(f"Record index {index}: {err}", record_index=index)

    def _refuse_empty(self) -> None:
        shown = remembered.listed(
            [f"{locations.display(name)} ({loc.size} bytes)"
             for name, loc in zip(self._names, self._locations, strict=True)]
        )
        what = f"{self.kind} {'object' if self._remote[0] else 'file'}"
        if len(self._names) > 1:
            what = f"Every one of the {len(self._names)} {self.kind} files and objects"
        msg = (
            f"{what} holds no record: {shown}. A source must hold at least one record; "
            "check the paths (an empty or truncated upload?)."
        )
        raise ValueError(msg)

    # -- objects: versions, content, what changed -----------------------------------------
    def _digest_of(self, file: int) -> str:
        # errors name the file or object (a changed or refused object, a failed read)
        return digests.digest(self._locations[file], self._storage.reads, self._storage.folder)

    def _content_facts(self) -> dict[str, str]:
        """Each file's digest and size, by base name (`Storage.identity` content; a name
        shared by files of several folders gets its position)."""
        names = [os.path.basename(name) for name in self._names]
        shared = {name for name in names if names.count(name) > 1} if len(set(names)) < len(
            names) else set()
        return {
            (f"{name} (file {i})" if name in shared else name): f"{found[:16]} of {loc.size} bytes"
            for i, (name, loc, found) in enumerate(
                zip(names, self._locations, self._digests, strict=True)
            )
        }

    def _facts(self) -> dict[str, str]:
        return {name: getattr(loc, "version", "") for name, loc in zip(
            self._names, self._locations, strict=True)}

    def _versions(self) -> str:
        """The ``versions`` order field: a digest of each object's version."""
        return content_identity([getattr(loc, "version", "") for loc in self._locations])

    def explain_field(self, field: str, saved: int | str) -> str | None:
        if field == "versions" and "versions" not in self._fields:
            return (
                "the checkpoint pinned the versions of objects where they were stored; to "
                "restore it onto the same bytes elsewhere (a local mirror, another bucket "
                "or protocol), build this source with Storage(identity='content')"
            )
        if field == "digests":
            differ = remembered.changes(
                self._keep_dir, "digests", str(saved), self._content_facts()
            )
            if differ is None:
                return (
                    "the bytes of some files differ from the checkpoint's; this machine does "
                    f"not remember which (their digests are kept in {self._keep_dir})"
                )
            return f"files whose bytes differ from the checkpoint's: {remembered.listed(differ)}"
        if field != "versions":
            return None
        differ = remembered.changes(self._keep_dir, "versions", str(saved), self._facts())
        if not differ:
            return None
        return f"objects changed since the checkpoint: {remembered.listed(differ)}"
