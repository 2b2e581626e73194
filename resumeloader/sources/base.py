"""The source contract: what a pipeline reads records through.

Users pass anything with ``len()`` and ``__getitem__(int)`` (`RandomAccessSource`);
`resumeloader.sources.adapt` wraps it in a `Source`, the one interface the stages
and workers read through. A new kind of source is a new module with a `Source`
subclass and one entry in `resumeloader.sources.registry`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["RandomAccessSource", "Source"]


@runtime_checkable
class RandomAccessSource(Protocol):
    """What the loader needs of a source: a length and integer indexing.

    ``source[i]`` must return the same record every time it is called with the same
    ``i`` (the loader re-reads records after a restore); it may be called from a
    thread that is not the main thread, and with ``worker_type="process"`` from a
    worker process that received the source pickled once.

    Batched access (optional): a source may also define ``read_batch(indices)``,
    taking an int64 NumPy array of record indices and returning those records
    stacked, with a leading dimension of ``len(indices)`` on every leaf and the
    same structure as one record (e.g. one database query or one ``pread`` per
    batch). The loader calls it once per batch instead of ``source[i]`` per record
    whenever there is no ``map_fn``, and checks the result against the element
    spec. NumPy arrays and dicts or tuples of equal-length arrays are read this way
    already.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class Source:
    """A random-access source as the pipeline sees it.

    Subclasses define `__len__`, `read` and `description`, and may define
    `read_batch` (then `batched` is True), `columns` (in-memory numeric arrays that
    the TensorFlow layer may gather from directly) and `order_fields` (what
    identifies the data, for the state's fingerprint). Instances are sent pickled to
    process workers, so they hold no closures.
    """

    #: Shown by ``describe()``.
    description = "source"

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, index: int) -> Any:
        """The record at `index`."""
        raise NotImplementedError

    @property
    def batched(self) -> bool:
        """Whether `read_batch` reads a whole batch in one call."""
        return False

    def read_batch(self, indices: np.ndarray) -> Any:
        """The records at `indices` stacked along a new leading dimension."""
        msg = f"{type(self).__name__} has no batched read."
        raise NotImplementedError(msg)

    def columns(self) -> tuple[list[np.ndarray], Any] | None:
        """The leaves and structure of in-memory numeric columns, or None."""
        return None

    def order_fields(self) -> dict[str, int | str]:
        """The fields identifying this data in the state (``num_records`` at least)."""
        return {"num_records": len(self)}
