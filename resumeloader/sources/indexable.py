"""`IndexableSource`: any ``len()`` + ``__getitem__(int)`` object; ``read_batch``, ``identity``."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base

__all__ = ["IndexableSource", "bounded", "user_identity"]

_MAX_IDENTITY = 200  # longer identities are stored as their hash (a state stays small)


def user_identity(source: Any) -> str | None:
    """The user's ``source.identity()`` as the ``identity`` order field (None without one).

    Raises:
        TypeError: ``identity`` is not callable, or returns neither a str nor an int.
    """
    hook = getattr(source, "identity", None)
    if hook is None:
        return None
    value = hook() if callable(hook) else hook
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        msg = (
            f"`{type(source).__name__}.identity()` must return a str or an int naming the "
            f"data (a version, a hash). Received: {value!r:.80} of type "
            f"{type(value).__name__}."
        )
        raise TypeError(msg)
    return bounded(str(value))


def bounded(text: str) -> str:
    """`text`, or when it is long its start and its hash (a state stays small)."""
    if len(text) <= _MAX_IDENTITY:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16)
    return f"{text[:80]}... blake2b:{digest.hexdigest()}"


class IndexableSource(base.Source):
    """Reads ``source[i]`` per record, ``source.read_batch(indices)`` per batch, or
    ``source.__getitems__(indices)`` (a list of records) per batch.

    A list of NumPy arrays whose shapes differ is a ragged source: its records become
    ``tf.RaggedTensor`` batches (the spec is read from every array once, here).

    Identity: ``source.identity()``, when the object has it, is the order field
    ``identity`` (see `RandomAccessSource`); without it only the length is checked
    when a checkpoint is restored.

    Args:
        source: an object with ``__len__`` and ``__getitem__(int)`` (see
            `RandomAccessSource`), not a str or bytes.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        if not callable(getattr(source, "read_batch", None)):
            base.without(self, "read_batch")
        if not callable(getattr(source, "__getitems__", None)):
            base.without(self, "read_many")
        self.description = type(source).__name__
        self._identity = self._find_identity(source)

    def _find_identity(self, source: Any) -> str | None:
        """What names the content of `source` (None: only its length does)."""
        return user_identity(source)

    @staticmethod
    def accepts(source: Any) -> bool:
        """Objects with ``__len__`` and ``__getitem__``, except str and bytes."""
        return isinstance(source, base.RandomAccessSource) and not isinstance(
            source, (str, bytes)
        )

    def __len__(self) -> int:
        return len(self._source)

    def read(self, index: int) -> Any:
        return self._source[index]

    def read_batch(self, indices: np.ndarray) -> Any:
        """The object's ``read_batch(indices)`` (only when it has one)."""
        return self._source.read_batch(indices)

    def read_many(self, indices: np.ndarray) -> list[Any]:
        """The object's ``__getitems__(indices)`` as a list (only when it has one)."""
        return list(self._source.__getitems__(indices.tolist()))

    def order_fields(self) -> dict[str, int | str]:
        fields: dict[str, int | str] = {"num_records": len(self)}
        if self._identity is not None:
            fields[base.IDENTITY] = self._identity
        return fields

    def record_spec(self) -> spec_lib.RecordSpec | None:
        """For a list of numeric arrays, their common spec (None where shapes differ)."""
        items = self._source
        if not isinstance(items, list) or not all(
            isinstance(item, np.ndarray) and item.dtype.kind in "biufc" for item in items
        ):
            return None
        leaf = spec_lib.LeafSpec.covering(items)
        if leaf is None:
            return None
        return spec_lib.RecordSpec(spec_lib.RecordSpec.of(items[0]).treespec, (leaf,))
