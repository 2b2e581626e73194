"""Named sources read as one: the record space of a mixture.

The parts are ordered by name; part ``k`` holds the concatenated indices
``[start_k, start_k + len(part_k))``. An index may also carry a *lap*: ``index =
lap * len(self) + concatenated index`` reads the same record as its concatenated
index. A mixture gives each appearance of a record its own index this way (the lap
is how many times its source was walked through before), so that randomness keyed by
the record index differs between repeats of a small source.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base

__all__ = ["ConcatSource"]

_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class ConcatSource(base.Source):
    """The records of several named sources, part after part in name order.

    Records of every part must have one structure: the same nesting, leaf dtypes and
    leaf ranks (checked on each part's record 0 when built; leaf sizes may differ,
    e.g. variable-length tokens, and are checked against the loader's element spec
    record by record).

    Args:
        parts: source name -> `Source`. Names are 1 to 64 letters, digits, ``_`` or
            ``-`` (they become state keys).

    Raises:
        ValueError: no part, a bad name, or parts whose records differ in structure.
    """

    def __init__(self, parts: Mapping[str, base.Source]) -> None:
        if not parts:
            msg = "A mixture needs at least one source. Received: sources={}."
            raise ValueError(msg)
        for name in parts:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                msg = (
                    "Source names must be strings of 1 to 64 letters, digits, '_' or '-' "
                    f"(they become state keys). Received: {name!r:.80}."
                )
                raise ValueError(msg)
        self.names = tuple(sorted(parts))
        self.parts = tuple(parts[name] for name in self.names)
        self.lengths = tuple(len(part) for part in self.parts)
        self.starts = tuple(int(s) for s in np.cumsum((0, *self.lengths[:-1])))
        self._length = sum(self.lengths)
        self._starts = np.asarray(self.starts, dtype=np.int64)
        self._batched = all(part.batched for part in self.parts)
        self.description = "mixture of " + ", ".join(
            f"{name} ({part.description}, {length:,})"
            for name, part, length in zip(self.names, self.parts, self.lengths, strict=True)
        )
        self._check_structures()

    def _check_structures(self) -> None:
        specs = []
        for name, part in zip(self.names, self.parts, strict=True):
            leaves, treespec = spec_lib.flatten(part.read(0))
            specs.append((name, treespec, [(a.dtype, a.ndim) for a in leaves], leaves))
        first = specs[0]
        for other in specs[1:]:
            if other[1:3] != first[1:3]:
                shown = [
                    f"{name}: {_describe(treespec, leaves)}" for name, treespec, _, leaves in specs
                ]
                msg = (
                    "Mixed sources must have records of one structure (nesting, leaf dtypes "
                    f"and ranks); source {other[0]!r} differs from {first[0]!r}. Received "
                    f"record 0 of each: {'; '.join(shown)}."
                )
                raise ValueError(msg)

    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> tuple[str, int, int]:
        """``(source name, lap, record index in that source)`` of an index."""
        lap, flat = divmod(int(index), self._length)
        part = bisect.bisect_right(self.starts, flat) - 1
        return self.names[part], lap, flat - self.starts[part]

    def read(self, index: int) -> Any:
        flat = index % self._length
        part = bisect.bisect_right(self.starts, flat) - 1
        return self.parts[part].read(flat - self.starts[part])

    @property
    def batched(self) -> bool:
        """Whether every part reads batches in one call."""
        return self._batched

    def read_batch(self, indices: np.ndarray) -> Any:
        flat = indices % self._length
        part_of = np.searchsorted(self._starts, flat, side="right") - 1
        present = np.unique(part_of)
        if len(present) == 1:
            part = int(present[0])
            return self.parts[part].read_batch(flat - self.starts[part])
        out: list[np.ndarray] | None = None
        treespec = None
        for part in present.tolist():
            where = np.flatnonzero(part_of == part)
            batch = self.parts[part].read_batch(flat[where] - self.starts[part])
            leaves, spec = optree.tree_flatten(batch, none_is_leaf=True)
            leaves = [np.asarray(leaf) for leaf in leaves]
            if out is None:
                treespec = spec
                out = [np.empty((len(indices), *a.shape[1:]), a.dtype) for a in leaves]
            got = [(a.dtype, a.shape[1:]) for a in leaves]
            if spec != treespec or got != [(a.dtype, a.shape[1:]) for a in out]:
                msg = (
                    f"Mixed source {self.names[part]!r} read a batch whose records differ from "
                    f"the other sources' in the same batch: {_describe(spec, leaves, batch=True)} "
                    f"vs {_describe(treespec, out, batch=True)} (per record). Records of one "
                    "batch must stack."
                )
                raise ValueError(msg)
            for target, leaf in zip(out, leaves, strict=True):
                target[where] = leaf
        assert out is not None and treespec is not None
        return optree.tree_unflatten(treespec, out)

    def order_fields(self) -> dict[str, int | str]:
        """The total length and every part's own fields, as ``"<name>.<field>"``."""
        fields: dict[str, int | str] = {"num_records": self._length}
        for name, part in zip(self.names, self.parts, strict=True):
            fields.update({f"{name}.{key}": value for key, value in part.order_fields().items()})
        return fields


def _describe(treespec: Any, leaves: list[np.ndarray], *, batch: bool = False) -> str:
    """A record's structure with each leaf's dtype and shape (of one record of a `batch`)."""
    parts = [f"{a.dtype.name}{list(a.shape[1:] if batch else a.shape)}" for a in leaves]
    return str(optree.tree_unflatten(treespec, parts)).replace("'", "")
