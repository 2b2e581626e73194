"""Any object with ``len()`` and ``__getitem__(int)``, optionally ``read_batch``."""

from __future__ import annotations

from typing import Any

import numpy as np

from resumeloader.sources import base

__all__ = ["IndexableSource"]


class IndexableSource(base.Source):
    """Reads ``source[i]`` per record, or ``source.read_batch(indices)`` per batch.

    Args:
        source: an object with ``__len__`` and ``__getitem__(int)`` (see
            `RandomAccessSource`), not a str or bytes.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        self._batched = callable(getattr(source, "read_batch", None))
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
