"""`ConcatSource`: named sources read as one, the record space of a mixture.

The parts are ordered by name; part ``k`` holds the concatenated indices
``[start_k, start_k + len(part_k))``. An index may also carry a *lap*: ``index =
lap * len(self) + concatenated index`` reads the same record as its concatenated
index. A mixture gives each appearance of a record its own index this way (the lap
is how many times its source was walked through before), so that randomness keyed by
the record index differs between repeats of a small source.

Parts *added* later (by a mixture's amendments) keep the indices of the others: added
part number ``tag`` (from 1) holds the indices ``tag * 2**TAG_SHIFT + lap * len(part)
+ record``, so adding one changes no index of the parts before it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base

__all__ = ["TAG_SHIFT", "ConcatSource"]

#: Indices of added parts start at ``tag << TAG_SHIFT``.
TAG_SHIFT = 56
_LOW = (1 << TAG_SHIFT) - 1

_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class ConcatSource(base.Source):
    """The records of several named sources, part after part in name order.

    Records of every part must have one structure: the same nesting, leaf dtypes and
    leaf ranks (checked on each part's record 0 when built; leaf sizes may differ,
    e.g. variable-length tokens, and are checked against the loader's element spec
    record by record). The mixture's spec comes from its parts' specs: a dimension
    that varies in any part varies in the mixture (ragged batches); strings and
    bytes (TFRecord, ArrayRecord, text columns) mix like any leaf.

    Args:
        parts: source name -> `Source`. Names are 1 to 64 letters, digits, ``_`` or
            ``-`` (they become state keys).
        added: ``(name, Source)`` of the parts added later, in tag order (see the
            module docstring); their records must fit the parts' spec.

    Raises:
        ValueError: no part, a bad or repeated name, or parts whose records differ in
            structure.
    """

    def __init__(
        self, parts: Mapping[str, base.Source], added: Sequence[tuple[str, base.Source]] = ()
    ) -> None:
        if not parts:
            msg = "A mixture needs at least one source. Received: sources={}."
            raise ValueError(msg)
        for name in [*parts, *(n for n, _ in added)]:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                msg = (
                    "Source names must be strings of 1 to 64 letters, digits, '_' or '-' "
                    f"(they become state keys). Received: {name!r:.80}."
                )
                raise ValueError(msg)
        self.names = tuple(sorted(parts))
        self.parts = tuple(parts[name] for name in self.names)
        self.lengths = tuple(len(part) for part in self.parts)
        repeated = sorted({n for n, _ in added} & set(self.names)) or sorted(
            {n for n, _ in added if [m for m, _ in added].count(n) > 1}
        )
        if repeated:
            msg = f"An added source needs a name of its own. Received: {repeated} twice."
            raise ValueError(msg)
        self.added = tuple((name, part) for name, part in added)
        self._all = (*self.parts, *(part for _, part in self.added))
        self._all_names = (*self.names, *(name for name, _ in self.added))
        self.starts = tuple(int(s) for s in np.cumsum((0, *self.lengths[:-1])))
        self._length = sum(self.lengths)
        self._starts = np.asarray(self.starts, dtype=np.int64)
        if not all(base.optional(part, "read_batch") for part in self._all):
            base.without(self, "read_batch")  # one part reads record by record
        if not any(base.optional(part, "read_many") for part in self._all):
            base.without(self, "read_many")  # no part reads many records faster
        self.description = "mixture of " + ", ".join(
            f"{name} ({part.description}, {len(part):,})"
            for name, part in zip(self._all_names, self._all, strict=True)
        )
        self._check_structures()

    def _check_structures(self) -> None:
        specs = []
        for name, part in zip(self._all_names, self._all, strict=True):
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
        self._treespec = first[1]
        firsts = [
            spec_lib.RecordSpec(t, tuple(spec_lib.LeafSpec(a.shape, a.dtype) for a in leaves))
            for _, t, _, leaves in specs
        ]
        self._spec = self._merged(self.parts, firsts)
        if self.added and self._merged(self._all, firsts) != self._spec:
            msg = (
                "A source added to a mixture must fit the records of its other sources "
                "(the batches before it would otherwise change form). Received: the "
                f"mixture's records {self._spec}; with {[n for n, _ in self.added]} "
                f"added: {self._merged(self._all, firsts)}."
            )
            raise ValueError(msg)

    def _merged(
        self, parts: Sequence[base.Source], firsts: list[spec_lib.RecordSpec]
    ) -> spec_lib.RecordSpec | None:
        """The parts' specs (their own, else that of their record 0) as one: None where
        they vary in any part; None as a whole where fixed sizes disagree (then the
        first mixed batch says which records do not stack)."""
        specs = [part.record_spec() or first for part, first in zip(parts, firsts, strict=False)]
        if any(spec.treespec != self._treespec for spec in specs):
            return None
        leaves = []
        for column in zip(*(spec.leaves for spec in specs), strict=True):
            dims: list[int | None] = []
            for sizes in zip(*(leaf.shape for leaf in column), strict=True):
                if None in sizes:
                    dims.append(None)
                elif len(set(sizes)) > 1:
                    return None
                else:
                    dims.append(sizes[0])
            leaves.append(spec_lib.LeafSpec(tuple(dims), column[0].dtype))
        return spec_lib.RecordSpec(self._treespec, tuple(leaves))

    def record_spec(self) -> spec_lib.RecordSpec | None:
        """The spec of every part's records (see the class docstring)."""
        return self._spec

    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> tuple[str, int, int]:
        """``(source name, lap, record index in that source)`` of an index."""
        index = int(index)
        tag = index >> TAG_SHIFT
        if tag:
            name, part = self.added[tag - 1]
            lap, record = divmod(index & _LOW, len(part))
            return name, lap, record
        lap, flat = divmod(index, self._length)
        part_number = bisect.bisect_right(self.starts, flat) - 1
        return self.names[part_number], lap, flat - self.starts[part_number]

    def record_key(self, index: int) -> dict[str, Any]:
        """The source, lap and record of an index, and the part's own key of the record."""
        name, lap, record = self.locate(index)
        part = self._all[self._all_names.index(name)]
        return {"source": name, "lap": lap, **part.record_key(record)}

    def record_keys(self, indices: np.ndarray) -> list[dict[str, Any]]:
        """`record_key` of each index, computed per part at once."""
        indices = np.asarray(indices, dtype=np.int64)
        part_of, local = self._split(indices)
        tag = indices >> TAG_SHIFT
        lengths = np.array([len(part) for part in self._all], dtype=np.int64)
        laps = np.where(tag == 0, indices // self._length, (indices & _LOW) // lengths[part_of])
        out: list[dict[str, Any]] = [{} for _ in range(len(indices))]
        for part in np.unique(part_of).tolist():
            where = np.flatnonzero(part_of == part)
            name = self._all_names[part]
            keys = self._all[part].record_keys(local[where])
            for at, lap, key in zip(where.tolist(), laps[where].tolist(), keys, strict=True):
                out[at] = {"source": name, "lap": lap, **key}
        return out

    def _split(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The part of each index and its record index in that part."""
        indices = np.asarray(indices, dtype=np.int64)
        if not self.added:
            flat = indices % self._length
            part_of = np.searchsorted(self._starts, flat, side="right") - 1
            return part_of, flat - self._starts[part_of]
        tag = indices >> TAG_SHIFT
        flat = np.where(tag == 0, indices % self._length, 0)
        part_of = np.searchsorted(self._starts, flat, side="right") - 1
        local = flat - self._starts[part_of]
        for number in np.unique(tag[tag > 0]).tolist():
            where = tag == number
            part_of[where] = len(self.parts) + number - 1
            local[where] = (indices[where] & _LOW) % len(self.added[number - 1][1])
        return part_of, local

    def read(self, index: int) -> Any:
        if self.added:
            part_of, local = self._split(np.array([index], dtype=np.int64))
            return self._all[int(part_of[0])].read(int(local[0]))
        flat = index % self._length
        part = bisect.bisect_right(self.starts, flat) - 1
        return self.parts[part].read(flat - self.starts[part])

    def read_many(self, indices: np.ndarray) -> list[Any]:
        """The records at `indices`, each part's read at once where it can (only when
        some part has ``read_many``)."""
        part_of, local = self._split(indices)
        out: list[Any] = [None] * len(local)
        for part in np.unique(part_of).tolist():
            where = np.flatnonzero(part_of == part)
            source = self._all[part]
            many = base.optional(source, "read_many")
            if many is not None:
                records = many(local[where])
            else:
                records = [source.read(i) for i in local[where].tolist()]
            for position, record in zip(where.tolist(), records, strict=True):
                out[position] = record
        return out

    def read_batch(self, indices: np.ndarray) -> Any:
        """The records at `indices` as one batch (only when every part has
        ``read_batch``)."""
        part_of, local = self._split(indices)
        present = np.unique(part_of)
        if len(present) == 1:
            only: Any = self._all[int(present[0])]
            return only.read_batch(local)
        pieces = []
        for part in present.tolist():
            where = np.flatnonzero(part_of == part)
            reader: Any = self._all[part]
            batch = reader.read_batch(local[where])
            try:
                columns = self._treespec.flatten_up_to(batch)
            except (ValueError, TypeError) as err:
                msg = (
                    f"Mixed source {self._all_names[part]!r} read a batch whose structure is not "
                    f"its records' ({err})."
                )
                raise ValueError(msg) from err
            pieces.append((part, where, columns))
        out = [
            self._column(len(indices), [(p, w, c[k]) for p, w, c in pieces])
            for k in range(self._treespec.num_leaves)
        ]
        return optree.tree_unflatten(self._treespec, out)

    def _column(self, size: int, pieces: list[tuple[int, np.ndarray, Any]]) -> Any:
        """One leaf of a mixed batch from each part's column: an array when every part
        gave arrays of one dtype and record shape, else a list with one value per record
        (strings, varying shapes)."""
        arrays = [c for _, _, c in pieces if isinstance(c, np.ndarray) and c.dtype != object]
        if len(arrays) == len(pieces):
            kinds = {(a.dtype, a.shape[1:]) for a in arrays}
            if len(kinds) > 1:
                shown = ", ".join(
                    f"{self._all_names[p]}: {c.dtype.name}{list(c.shape[1:])}"
                    for p, _, c in pieces
                )
                msg = (
                    f"Mixed sources read records that do not stack into one batch ({shown} "
                    "per record). Records of one batch must stack: give the sources one "
                    "record shape, or vary it in a source (a ragged leaf)."
                )
                raise ValueError(msg)
            dtype, shape = kinds.pop()
            column = np.empty((size, *shape), dtype)
            for (_, where, _), array in zip(pieces, arrays, strict=True):
                column[where] = array
            return column
        values: list[Any] = [None] * size
        for _, where, piece in pieces:
            for position, value in zip(where.tolist(), list(piece), strict=True):
                values[position] = value
        return values

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
