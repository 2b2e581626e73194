"""`PackStage`: windows of sequences packed into rows of length L (first fit, T5 layout).

The layout is the one T5 and MaxText train on: every sequence leaf ``k`` of a record
becomes a row ``k`` of length ``L_k`` holding several records' tokens one after the
other, with ``k_segment_ids`` (1, 2, ... for the records of the row in order, 0 for
padding) and ``k_positions`` (0, 1, ... within each record, 0 for padding). A record
that is one array packs into ``{"tokens", "segment_ids", "positions"}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.core import validate
from resumeloader.stages import base, fields
from resumeloader.stages.batching import grouping, padding

__all__ = ["PackStage"]

_IDS = np.dtype(np.int32)


@dataclasses.dataclass(frozen=True)
class PackStage(base.WindowedBatchStage):
    """Rows of several sequences each, `batch_size` rows per batch; the count varies
    (`Pipeline.pack`).

    The records of each window of `window` consecutive positions (aligned to the
    epoch's start; an epoch's last window may be shorter) are packed first-fit
    decreasing (`grouping.first_fit_decreasing`: longest first, each into the first
    row where every leaf fits, ties by position) into rows of `length` tokens per leaf.
    The rows are ordered by a pure function of (seed, epoch, window) and cut into
    batches of `batch_size` rows; the window's last batch is filled with empty rows, so
    every batch has the same shape. Every leaf must be a numeric sequence (its first
    dimension its length); records must be one array or a dict of them. A leaf ``k``
    becomes ``k`` (the tokens), ``k_segment_ids`` and ``k_positions``; a record that is
    one array becomes ``tokens``, ``segment_ids`` and ``positions``.

    Guarantees: each record of a window is in exactly one row of one of its batches;
    no row exceeds its length; a batch counts the records it holds, so the position
    after it is exact, but the number of batches of an epoch depends on the data
    (``len(loader)`` and ``batches_per_epoch`` raise; Keras needs
    ``epoch_dataset(loader)`` without ``steps_per_epoch``). Every argument is an order
    field.

    Args:
        length: tokens per row: one int for every leaf, or a mapping of a dict
            record's keys to ints.
        window: positions per window (more: fuller rows, more to recompute on a
            restore inside a window).
        batch_size: rows per batch.
        pad_value: the fill value of padding (one value, or a mapping per key).

    Examples:
        >>> import numpy as np
        >>> from resumeloader import Pipeline, ResumableLoader
        >>> data = [np.arange(1, n + 1) for n in (3, 2, 4, 1)]
        >>> pipeline = Pipeline(data, seed=0).pack(5, window=4, batch_size=2)
        >>> batch = next(iter(ResumableLoader.from_pipeline(pipeline)))
        >>> batch["tokens"].numpy().tolist()
        [[1, 2, 3, 1, 2], [1, 2, 3, 4, 1]]
        >>> batch["segment_ids"].numpy().tolist()
        [[1, 1, 1, 2, 2], [1, 1, 1, 1, 2]]
        >>> batch["positions"].numpy().tolist()
        [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    """

    name = "pack"
    # Changing the packing, the row order or the layout changes every packed stream: bump it.
    algorithm = "first-fit-decreasing-v1"
    known_counts = False

    length: Any = dataclasses.field(
        metadata=fields.meta(check=fields.lengths(none=False), order=fields.text(""))
    )
    window: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )
    batch_size: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )
    pad_value: Any = dataclasses.field(
        default=0, kw_only=True, metadata=fields.meta(order=fields.text("0"))
    )
    _layouts: dict[spec_lib.RecordSpec, _Layout] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def batch_dim(self) -> int:
        return self.batch_size

    def layout(self, spec: spec_lib.RecordSpec) -> _Layout:
        """The packed layout of records of `spec` (built once per spec)."""
        layout = self._layouts.get(spec)
        if layout is None:
            layout = self._layouts[spec] = _Layout(spec, self.length, self.pad_value)
        return layout

    def output_spec(self, spec: spec_lib.RecordSpec) -> spec_lib.RecordSpec:
        return self.layout(spec).output

    def group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[base.Group]:
        layout = self.layout(spec)
        lengths = np.stack([_lengths(column) for column in columns], axis=1)
        over = np.flatnonzero((lengths > layout.capacities).any(axis=1))
        if over.size:
            slot = int(over[0])
            msg = (
                f"A record of lengths {lengths[slot].tolist()} (per leaf: "
                f"{', '.join(spec.paths())}) is longer than a packed row of "
                f"{layout.capacities.tolist()}. Truncate records in a map stage first."
            )
            raise base.GroupError(msg, slot=slot)
        bins = grouping.first_fit_decreasing(lengths, layout.capacities)
        order = grouping.batch_order(len(bins), seed=seed, epoch=epoch, window=window)
        rows = [bins[i] for i in order.tolist()]
        groups = []
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            sizes = [len(row) for row in batch] + [0] * (self.batch_size - len(batch))
            splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            groups.append(base.Group(np.concatenate(batch), splits))
        return groups

    def assemble_group(
        self, columns: list[base.Column], spec: spec_lib.RecordSpec, group: base.Group
    ) -> list[Any]:
        return self.layout(spec).assemble(columns, group)

    def describe(self) -> str:
        length = fields.text("")(self.length)
        return f"pack(length {length}, window {self.window}, {self.batch_size} rows per batch)"


def _lengths(column: base.Column) -> np.ndarray:
    return np.fromiter((len(a) for a in column), np.int64, len(column))


class _Layout:
    """Where each leaf of records of `spec` goes in packed rows, and the output spec."""

    def __init__(self, spec: spec_lib.RecordSpec, length: Any, pad_value: Any) -> None:
        paths = spec.treespec.paths()
        record = optree.tree_unflatten(spec.treespec, list(range(len(spec.leaves))))
        flat = spec.treespec.num_nodes == 1 or (
            isinstance(record, dict)
            and all(isinstance(k, str) and isinstance(v, int) for k, v in record.items())
        )
        bad = [
            p for p, leaf in zip(spec.paths(), spec.leaves, strict=True)
            if leaf.is_string or not leaf.shape or None in leaf.shape[1:]
        ]
        if bad or not flat:
            msg = (
                "pack() packs sequences: records must be one numeric array of one or more "
                "dimensions, the first its length, or a dict of them (records of varying "
                "length need `output_signature` with None for it, e.g. "
                "tf.TensorSpec((None,), tf.int32)). Received records "
                f"{spec.describe()}; not packable: {bad or 'the structure'}."
            )
            raise ValueError(msg)
        keys = [path[0] if path else "tokens" for path in paths]
        lengths = padding.per_leaf("length", length, spec, None)
        named = zip(keys, lengths, strict=True)
        sizes = [validate.integer(f"length ({k})", n, low=1) for k, n in named]
        self.capacities = np.array(sizes, dtype=np.int64)
        values = padding.per_leaf("pad_value", pad_value, spec, 0)
        self.values = [
            padding.cast_pad_value(v, leaf, f"record[{k!r}]")
            for v, leaf, k in zip(values, spec.leaves, keys, strict=True)
        ]
        self.spec = spec
        prefixes = [f"{k}_" if path else "" for k, path in zip(keys, paths, strict=True)]
        template: dict[str, str] = {}
        for i, (key, prefix) in enumerate(zip(keys, prefixes, strict=True)):
            template[key] = f"v{i}"
            template[f"{prefix}segment_ids"] = f"s{i}"
            template[f"{prefix}positions"] = f"p{i}"
        if len(template) != 3 * len(keys):
            msg = (
                "pack() adds '<key>_segment_ids' and '<key>_positions' beside each leaf, but "
                f"the records already have such a key. Received records {spec.describe()}."
            )
            raise ValueError(msg)
        markers, treespec = optree.tree_flatten(template)  # type: ignore[arg-type,var-annotated]
        self._markers: list[str] = markers
        leaves = []
        for marker in self._markers:
            i = int(marker[1:])
            size, leaf = int(self.capacities[i]), spec.leaves[i]
            if marker[0] == "v":
                leaves.append(spec_lib.LeafSpec((size, *leaf.shape[1:]), leaf.dtype))
            else:
                leaves.append(spec_lib.LeafSpec((size,), _IDS))
        self.output = spec_lib.RecordSpec(treespec, tuple(leaves))

    def assemble(self, columns: list[base.Column], group: base.Group) -> list[Any]:
        """The leaves of the packed batch `group` (rows of slots) of `columns`."""
        assert group.row_splits is not None
        rows = len(group.row_splits) - 1
        sizes = np.diff(group.row_splits)
        row_of = np.repeat(np.arange(rows, dtype=np.int64), sizes)
        segment = np.arange(len(group.slots), dtype=np.int64) - np.repeat(
            group.row_splits[:-1], sizes
        )
        built: dict[str, np.ndarray] = {}
        for i, column in enumerate(columns):
            built.update(self._leaf(i, column, group, row_of, segment + 1))
        return [built[marker] for marker in self._markers]

    def _leaf(
        self, i: int, column: base.Column, group: base.Group, row_of: np.ndarray,
        segment_ids: np.ndarray,
    ) -> dict[str, np.ndarray]:
        leaf, size = self.spec.leaves[i], int(self.capacities[i])
        row_splits = group.row_splits
        assert row_splits is not None
        rows = len(row_splits) - 1
        arrays = [column[s] for s in group.slots.tolist()]
        lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        # Slots come row after row: a record's offset in its row is the tokens before it
        # minus the tokens before its row.
        before = np.cumsum(lengths) - lengths
        row_base = np.concatenate([[0], np.cumsum(lengths)])[row_splits[:-1]]
        starts = before - row_base[row_of]
        within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(before, lengths)
        dest = np.repeat(row_of * size + starts, lengths) + within
        trailing = tuple(int(d) for d in leaf.shape[1:] if d is not None)
        values = np.full((rows * size, *trailing), self.values[i], dtype=leaf.dtype)
        ids = np.zeros(rows * size, dtype=_IDS)
        positions = np.zeros(rows * size, dtype=_IDS)
        if len(arrays):
            values[dest] = np.concatenate(arrays)
        ids[dest] = np.repeat(segment_ids, lengths)
        positions[dest] = within
        shape = (rows, size)
        return {
            f"v{i}": values.reshape(*shape, *trailing),
            f"s{i}": ids.reshape(shape),
            f"p{i}": positions.reshape(shape),
        }
