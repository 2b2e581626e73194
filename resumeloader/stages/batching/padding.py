"""`Padding`, `PaddedStage`: a batch's varying leaves padded into dense arrays (pure NumPy).

The helpers of the padded, bucketing and token-budget batch stages: which leaves are
padded (numeric leaves with a ``None`` dimension), with which length and value, the
spec of the padded batches (with an optional mask per padded leaf), and the padding
itself. Strings are never padded: a string leaf stays as `Pipeline.batch` makes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.core import validate
from resumeloader.stages import base, fields

__all__ = ["PaddedStage", "Padding"]

MASK_SUFFIX = "_mask"


def per_leaf(name: str, value: Any, spec: spec_lib.RecordSpec, default: Any) -> list[Any]:
    """`value` for every leaf: one value for all, or a mapping of a dict record's keys.

    Raises:
        ValueError: a mapping for a record that is not a dict, or naming no key of it.
    """
    if not isinstance(value, Mapping):
        return [value] * len(spec.leaves)
    paths = spec.treespec.paths()
    keys = {path[0] for path in paths if path}
    unknown = sorted(map(str, set(value) - keys))
    if unknown or not all(path for path in paths):
        msg = (
            f"`{name}` as a mapping gives a value per key of dict records. Received keys "
            f"{unknown or sorted(map(str, value))} for records {spec.describe()}."
        )
        raise ValueError(msg)
    return [value.get(path[0], default) for path in paths]


def cast_pad_value(value: Any, leaf: spec_lib.LeafSpec, path: str) -> Any:
    """`value` as a scalar of the leaf's dtype (NaN for a float leaf: NaN equals nothing,
    yet every float dtype holds it).

    Raises:
        ValueError: the dtype cannot hold `value` exactly.
    """
    try:
        cast = np.array(value, dtype=leaf.dtype)
        given = np.array(value)
        exact = cast.shape == () and bool(cast == given)
        if not exact and cast.dtype.kind == "f" and given.dtype.kind == "f":
            exact = bool(np.isnan(cast) and np.isnan(given))
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        msg = (
            f"`pad_value` for {path} must be a number that {leaf.dtype.name} holds "
            f"exactly. Received: pad_value={value!r:.40}."
        )
        raise ValueError(msg)
    return cast[()]


class Padding:
    """How the records of `spec` are padded into batches (see the module docstring).

    Args:
        spec: the records' spec.
        pad_to: None (each batch to its longest record), a length for every varying
            dimension, or a mapping of a dict record's keys to one of those.
        pad_value: the fill value, or a mapping of a dict record's keys to one.
        mask: add a boolean mask per padded leaf (True where a record has data, along
            its first varying dimension): ``"<key>_mask"`` next to each padded leaf of
            a dict record; a record that is one array becomes ``(values, mask)``.
        truncate: cut records longer than a fixed `pad_to` instead of raising.

    Raises:
        ValueError: no leaf varies, or an argument does not fit the records.
    """

    def __init__(
        self, spec: spec_lib.RecordSpec, *, pad_to: Any, pad_value: Any, mask: bool,
        truncate: bool,
    ) -> None:
        self.spec = spec
        self.padded = [leaf.ragged and not leaf.is_string for leaf in spec.leaves]
        if not any(self.padded):
            msg = (
                "Padding needs a numeric leaf whose length varies from record to record, but "
                f"no leaf of these records does: {spec.describe()}. A source or a `map_fn` "
                "returning such arrays needs `output_signature` with None for the varying "
                "dimension, e.g. tf.TensorSpec((None,), tf.int64)."
            )
            raise ValueError(msg)
        paths = spec.paths()
        lengths = per_leaf("pad_to", pad_to, spec, None)
        self.pad_to = [
            None if n is None else validate.integer(f"pad_to ({p})", n, low=1)
            for n, p in zip(lengths, paths, strict=True)
        ]
        values = per_leaf("pad_value", pad_value, spec, 0)
        self.values = [
            cast_pad_value(v, leaf, p) if on else None
            for v, leaf, p, on in zip(values, spec.leaves, paths, self.padded, strict=True)
        ]
        self.truncate = truncate
        self.mask = mask
        self.leaf_specs = [self._leaf(i) for i in range(len(spec.leaves))]
        self._markers, self.output = self._structure()

    def _leaf(self, i: int) -> spec_lib.LeafSpec:
        leaf = self.spec.leaves[i]
        if not self.padded[i]:
            return leaf
        size = self.pad_to[i]
        shape = tuple(size if dim is None else dim for dim in leaf.shape)
        return spec_lib.LeafSpec(shape, leaf.dtype, dense=size is None)

    def _structure(self) -> tuple[list[str], spec_lib.RecordSpec]:
        count = len(self.spec.leaves)
        template = optree.tree_unflatten(self.spec.treespec, [f"v{i}" for i in range(count)])
        if self.mask:
            template = _with_masks(template, self.padded, self.spec)
        markers, treespec = optree.tree_flatten(template, none_is_leaf=True)
        specs = []
        for marker in markers:
            i = int(marker[1:])
            if marker[0] == "v":
                specs.append(self.leaf_specs[i])
            else:
                first = self.leaf_specs[i].shape[:1]
                specs.append(spec_lib.LeafSpec(first, np.dtype(bool), dense=first == (None,)))
        return markers, spec_lib.RecordSpec(treespec, tuple(specs))

    def lengths(self, columns: list[base.Column]) -> np.ndarray:
        """Each record's length: its longest first varying dimension of a padded leaf."""
        count = len(columns[0])
        longest = np.zeros(count, dtype=np.int64)
        for column, leaf, on in zip(columns, self.spec.leaves, self.padded, strict=True):
            if on:
                axis = leaf.shape.index(None)
                sizes = np.fromiter((np.shape(a)[axis] for a in column), np.int64, count)
                np.maximum(longest, sizes, out=longest)
        return longest

    def assemble(self, columns: list[base.Column], slots: np.ndarray | None = None) -> list[Any]:
        """The padded batch of the records at `slots` of `columns` (all when None)."""
        built: dict[str, Any] = {}
        for i, (column, leaf) in enumerate(zip(columns, self.spec.leaves, strict=True)):
            part = _take(column, slots)
            if not self.padded[i]:
                built[f"v{i}"] = part if leaf.ragged or leaf.is_string else _stacked(part)
                continue
            values, mask = self._pad(part, i)
            built[f"v{i}"] = values
            built[f"m{i}"] = mask
        return [built[marker] for marker in self._markers]

    def _pad(self, column: list[np.ndarray], i: int) -> tuple[np.ndarray, np.ndarray]:
        leaf = self.spec.leaves[i]
        shapes = np.array([np.shape(a) for a in column], dtype=np.int64).reshape(
            len(column), len(leaf.shape)
        )
        varying = [d for d, dim in enumerate(leaf.shape) if dim is None]
        longest = shapes[:, varying].max(axis=0) if len(column) else np.zeros(len(varying))
        size = self.pad_to[i]
        if size is not None:
            over = np.flatnonzero((shapes[:, varying] > size).any(axis=1))
            if over.size and not self.truncate:
                slot = int(over[0])
                msg = (
                    f"{self.spec.paths()[i]} has shape {tuple(shapes[slot])}, longer than "
                    f"pad_to={size}. Pass truncate=True to cut such records, or a larger pad_to."
                )
                raise base.GroupError(msg, slot=slot)
            longest = np.full(len(varying), size)
            if over.size:
                column = [_cut(a, varying, size) for a in column]
                shapes[:, varying] = np.minimum(shapes[:, varying], size)
        sizes = dict(zip(varying, longest.tolist(), strict=True))
        target = tuple(int(sizes[d]) if dim is None else dim for d, dim in enumerate(leaf.shape))
        out = np.full((len(column), *target), self.values[i], dtype=leaf.dtype)
        if varying[0] == 0:
            mask = np.arange(target[0])[None, :] < shapes[:, :1]
        else:  # the first dimension is fixed: every record fills it
            mask = np.ones((len(column), target[0]), dtype=np.bool_)
        if varying == [0] and len(column):
            out[mask] = np.concatenate(column)
        else:
            for row, (a, shape) in enumerate(zip(column, shapes.tolist(), strict=True)):
                index: tuple[Any, ...] = (row, *[slice(0, n) for n in shape])
                out[index] = a
        return out, mask


def _stacked(part: Any) -> np.ndarray:
    return part if isinstance(part, np.ndarray) else np.stack(part)


def _take(column: base.Column, slots: np.ndarray | None) -> Any:
    if slots is None:
        return column
    if isinstance(column, np.ndarray):
        return column[slots]
    return [column[s] for s in slots.tolist()]


def _cut(array: np.ndarray, varying: list[int], size: int) -> np.ndarray:
    index = tuple(slice(0, size) if d in varying else slice(None) for d in range(array.ndim))
    return array[index]


def _with_masks(template: Any, padded: list[bool], spec: spec_lib.RecordSpec) -> Any:
    """The output structure: ``"<key>_mask"`` beside each padded leaf of a dict, or
    ``(values, mask)`` for a record that is one array."""
    if isinstance(template, str):
        return (template, f"m{template[1:]}")

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                out[key] = walk(value)
                if isinstance(value, str) and padded[int(value[1:])]:
                    name = f"{key}{MASK_SUFFIX}"
                    if name in node:
                        msg = (
                            f"mask=True adds the key {name!r}, which the records already "
                            f"have. Received records {spec.describe()}."
                        )
                        raise ValueError(msg)
                    out[name] = f"m{value[1:]}"
            return out
        if isinstance(node, str):
            return node
        msg = (
            "mask=True needs records that are one array or dicts (a mask goes beside each "
            f"padded leaf as '<key>{MASK_SUFFIX}'). Received records {spec.describe()}."
        )
        raise ValueError(msg)

    return walk(template)


@dataclasses.dataclass(frozen=True)
class PaddedStage(base.BatchStage):
    """The padding fields of the batch stages that pad their batches (see `Padding`),
    and a `Padding` per record spec (built once per spec)."""

    pad_to: Any = dataclasses.field(
        default=None,
        kw_only=True,
        metadata=fields.meta(check=fields.lengths(none=True), order=fields.text("longest")),
    )
    pad_value: Any = dataclasses.field(
        default=0, kw_only=True, metadata=fields.meta(order=fields.text("0"))
    )
    mask: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag, order=True)
    )
    truncate: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag, order=True)
    )
    _paddings: dict[spec_lib.RecordSpec, Padding] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def padding(self, spec: spec_lib.RecordSpec) -> Padding:
        """The `Padding` of records of `spec`."""
        padding = self._paddings.get(spec)
        if padding is None:
            padding = self._paddings[spec] = Padding(
                spec, pad_to=self.pad_to, pad_value=self.pad_value, mask=self.mask,
                truncate=self.truncate,
            )
        return padding

    def output_spec(self, spec: spec_lib.RecordSpec) -> spec_lib.RecordSpec:
        return self.padding(spec).output

    def pad_text(self) -> str:
        """The padding in words, for ``describe()``."""
        mask = ", mask" if self.mask else ""
        return f"padded to {fields.text('longest')(self.pad_to)}{mask}"
