"""Any object with ``len()`` and ``__getitem__(int)``, optionally ``read_batch``."""

from __future__ import annotations

from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base

__all__ = ["IndexableSource"]


class IndexableSource(base.Source):
    """Reads ``source[i]`` per record, ``source.read_batch(indices)`` per batch, or
    ``source.__getitems__(indices)`` (a list of records) per batch.

    A list of NumPy arrays whose shapes differ is a ragged source: its records become
    ``tf.RaggedTensor`` batches (the spec is read from every array once, here).

    Args:
        source: an object with ``__len__`` and ``__getitem__(int)`` (see
            `RandomAccessSource`), not a str or bytes.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        self._batched = callable(getattr(source, "read_batch", None))
        self._many = callable(getattr(source, "__getitems__", None))
        self.description = type(source).__name__

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

    @property
    def batched(self) -> bool:
        return self._batched

    def read_batch(self, indices: np.ndarray) -> Any:
        return self._source.read_batch(indices)

    @property
    def reads_many(self) -> bool:
        return self._many

    def read_many(self, indices: np.ndarray) -> list[Any]:
        if self._many:
            return list(self._source.__getitems__(indices.tolist()))
        return super().read_many(indices)

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
