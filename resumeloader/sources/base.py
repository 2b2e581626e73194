"""The source contract: what a pipeline reads records through.

Users pass anything with ``len()`` and ``__getitem__(int)`` (`RandomAccessSource`);
`resumeloader.sources.adapt` wraps it in a `Source`, the one interface the stages
and workers read through. A new kind of source is a new module with a `Source`
subclass and one entry in `resumeloader.sources.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = [
    "CAPABILITIES",
    "IDENTITY",
    "CorruptRecordError",
    "RandomAccessSource",
    "RecordReadError",
    "Source",
    "optional",
    "without",
]

#: The order field in which a source names its content (a digest, a version): see
#: `Source.order_fields`.
IDENTITY = "identity"


class CorruptRecordError(ValueError):
    """A stored record cannot be read as it was written: it fails its checksum or its
    framing, or its file changed or is damaged (the message names the file and the
    record). It reaches you as the `RecordError` of the record.

    Attributes:
        record_index: the record's index in the source.
    """

    def __init__(self, msg: str, *, record_index: int) -> None:
        super().__init__(msg)
        self.record_index = record_index


class RecordReadError(OSError):
    """A stored record could not be read: its storage still failed after the retries
    (the message names the object, the byte range and the last error). It reaches you
    as the `RecordError` of the record, and goes through ``Pipeline.on_error``.

    Attributes:
        record_index: the record's index in the source.
    """

    def __init__(self, msg: str, *, record_index: int) -> None:
        super().__init__(msg)
        self.record_index = record_index


@runtime_checkable
class RandomAccessSource(Protocol):
    """What the loader needs of a source: a length and integer indexing.

    ``source[i]`` must return the same record every time it is called with the same
    ``i`` (the loader re-reads records after a restore); it may be called from a
    thread that is not the main thread, and with ``Workers(kind="process")`` from a
    worker process that received the source pickled once.

    Records may hold NumPy arrays, numbers, bytes and str (strings become
    ``tf.string``; arrays whose shapes vary from record to record become
    ``tf.RaggedTensor`` batches).

    Batched access (optional): a source may also define ``read_batch(indices)``,
    taking an int64 NumPy array of record indices and returning those records
    stacked, with a leading dimension of ``len(indices)`` on every leaf and the
    same structure as one record (e.g. one database query or one ``pread`` per
    batch). The loader calls it once per batch instead of ``source[i]`` per record
    whenever there is no ``map_fn``, and checks the result against the element
    spec (a leaf of strings or of varying shape may be a list with one value per
    record). NumPy arrays and dicts or tuples of equal-length columns are read this
    way already. A source with ``__getitems__(indices)`` returning a list of records
    (Hugging Face ``datasets``, tfds data sources) is read a batch at a time too.

    Identity (optional): a source may also define ``identity()``, returning a str
    that names its content (a version, a snapshot id, a hash). It enters the
    checkpoint (``source.identity``), and a checkpoint of another identity is
    refused. Without it only the source's length identifies it: a checkpoint of
    other data of the same length restores silently.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


#: The optional methods of a `Source` (its capabilities): a source has one when it
#: defines the method (see `optional`).
CAPABILITIES = ("read_batch", "read_many", "prefetch", "readahead")


def optional(source: Any, name: str) -> Callable[..., Any] | None:
    """`source`'s optional method `name` (one of `CAPABILITIES`), or None when it has
    none: a capability is the presence of its method, never a flag beside it."""
    found = getattr(source, name, None)
    return found if callable(found) else None


def without(source: Source, *names: str) -> None:
    """Removes the capabilities `names` from `source` (an instance whose class defines
    them but that cannot honour them: e.g. nothing to prefetch), as ``__hash__ = None``
    removes hashing; copies and pickles of it keep them removed."""
    for name in names:
        assert name in CAPABILITIES, name
        setattr(source, name, None)


class Source:
    """A random-access source as the pipeline sees it.

    Subclasses define `__len__`, `read` and `description`, and may define `columns`
    (in-memory numeric arrays that the TensorFlow layer may gather from directly),
    `record_spec` (the spec of every record, when the source knows it) and
    `order_fields` (what identifies the data, for the state's fingerprint).

    Capabilities are optional methods, present or not (`optional` finds them; a
    subclass that inherits one it cannot honour removes it with `without`):

    * ``read_batch(indices) -> batch``: the records at `indices` (an int64 array)
      stacked along a new leading dimension, in one call (then a pipeline without
      record stages reads each batch with it);
    * ``read_many(indices) -> list``: the records at `indices`, in that order, faster
      than one `read` each;
    * ``prefetch(indices) -> bool``: starts reading what `indices` will need (their
      bytes in object storage) and returns at once, False when the read-ahead budget
      is full; it changes nothing that is read. A source whose budget a loader may
      choose takes ``prefetch(indices, budget=bytes)`` and says so with
      ``readahead() -> (readahead_bytes, cache_bytes)``, ``"auto"`` first.

    Instances are sent pickled to process workers, so they hold no closures; reads
    may come from several threads at once.
    """

    #: Shown by ``describe()``.
    description = "source"

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, index: int) -> Any:
        """The record at `index`."""
        raise NotImplementedError

    @property
    def exact_batches(self) -> bool:
        """Whether `read_batch` always returns arrays that are exactly `record_spec`'s
        leaves (then a batch the pipeline reads with that spec is not checked again)."""
        return False

    def record_spec(self) -> spec_lib.RecordSpec | None:
        """The spec every record has, when the source knows it (else inferred from record 0)."""
        return None

    def columns(self) -> tuple[list[np.ndarray], Any] | None:
        """The leaves and structure of in-memory numeric columns, or None."""
        return None

    def record_key(self, index: int) -> dict[str, Any]:
        """What names the record at `index` for lineage (``loader.records_at``):
        ``{"record": index}``, and where it lives for a source that knows (a file
        source adds ``file`` and ``file_record``, its number in that file)."""
        return {"record": int(index)}

    def record_keys(self, indices: np.ndarray) -> list[dict[str, Any]]:
        """`record_key` of each of `indices` (a source may compute them at once)."""
        return [self.record_key(index) for index in indices.tolist()]

    # -- storage read by ranges (optional) ---------------------------------------------
    def mean_record_bytes(self) -> float | None:
        """Stored bytes per record, when the source knows them (the block order's chunk
        size in bytes is resolved with it)."""
        return None

    def records_per_file(self) -> list[int] | None:
        """Records of each file or object in order, for a source that reads files."""
        return None

    def blocked(self, block_records: int | None, *, window_chunks: int = 1) -> Source:
        """This source reading its storage a block of `block_records` consecutive records
        at a time (or not, for None), in windows of `window_chunks` blocks (the block
        order's); the records are the same. Default: itself."""
        return self

    def dry_read(self, indices: np.ndarray, dry: Any) -> bool:
        """Records in `dry` (a `resumeloader.sources.storage.fetch.DryRun`) the storage
        requests that reading `indices` in one call (``read_batch`` or ``read_many``)
        sends, without sending them; False when the source cannot tell (its reads are not
        ranges of files or objects). Default: False."""
        return False

    def dry_prefetch(self, indices: np.ndarray, dry: Any) -> bool:
        """Records in `dry` (a `resumeloader.sources.storage.fetch.DryRun`) the GETs that
        ``prefetch(indices)`` starts, without sending them; returns what `prefetch`
        would. Default: nothing to do (True)."""
        return True

    def explain_field(self, field: str, saved: int | str) -> str | None:
        """Why order field `field` is `saved` in a checkpoint and not what it is now, in
        words, when the source can tell (e.g. which objects changed); else None."""
        return None

    def order_fields(self) -> dict[str, int | str]:
        """The fields identifying this data in the state (``num_records`` at least).

        A field named `IDENTITY` (``"identity"``) names the content (a digest, a
        version). It is the one field a checkpoint may lack (those written before
        0.3 have none): such a checkpoint is restored after the other fields match.
        """
        return {"num_records": len(self)}
