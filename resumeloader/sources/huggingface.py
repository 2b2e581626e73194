"""`HuggingFaceSource`: a Hugging Face ``datasets.Dataset`` (the `datasets` extra), read by batch.

The dataset's features give the record spec before anything is read: a ``Value``
column is a scalar (strings and binaries become ``tf.string``), a ``ClassLabel`` an
int64, a ``List`` of length -1 a dimension that varies (``tf.RaggedTensor``
batches), a ``List`` of fixed length or an ``ArrayND`` a fixed dimension, a dict of
features a dict. A batch is one Arrow ``take`` of its rows, converted column by
column to NumPy in the features' own dtypes (a ``List(Value("float32"), length=16)``
column is one ``float32[16]`` leaf, not 16 scalars; ``uint8`` stays ``uint8``).
Images and audio are read undecoded (``{"bytes", "path"}``): decode them in
TensorFlow with `Pipeline.tf_map`; an image stored as bytes has no path (None in the
dataset), read as ``""``. A missing (null) value raises a `RecordError`
naming the column and the row unless a fill value is declared for it
(`resumeloader.sources.arrow`); ``set_format(columns=[...])`` selects the columns read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.sources import arrow, base

__all__ = ["HuggingFaceSource"]

_STRINGS = ("string", "large_string", "binary", "large_binary")
_LISTS = ("List", "Sequence", "LargeList")
_ENCODED = ("Image", "Audio", "Video", "Pdf")  # stored as {"bytes", "path"}


def _is_spec(x: Any) -> bool:
    return isinstance(x, spec_lib.LeafSpec)


def _refuse(path: str, feature: Any, why: str) -> NoReturn:
    msg = f"Column {path} has feature {feature!r}, which {why}."
    raise TypeError(msg)


def _spec(feature: Any, path: str) -> Any:
    """The LeafSpec (or dict of them) of one feature."""
    kind = type(feature).__name__
    if isinstance(feature, dict):
        return {key: _spec(value, f"{path}[{key!r}]") for key, value in feature.items()}
    if kind == "Value":
        if feature.dtype in _STRINGS:
            return spec_lib.LeafSpec((), spec_lib.STRING)
        try:
            return spec_lib.LeafSpec((), np.dtype(feature.dtype))
        except TypeError:
            _refuse(path, feature, "has no NumPy dtype (cast it, e.g. to an int64 or string)")
    if kind == "ClassLabel":
        return spec_lib.LeafSpec((), np.dtype(np.int64))
    if kind in _LISTS:
        inner = _spec(feature.feature, path)
        if not _is_spec(inner):
            _refuse(path, feature, "is a list of dicts (a dict of lists per record); flatten it")
        length = getattr(feature, "length", -1)
        return spec_lib.LeafSpec((None if length == -1 else length, *inner.shape), inner.dtype)
    if kind.startswith("Array") and kind.endswith("D"):
        return spec_lib.LeafSpec(tuple(feature.shape), np.dtype(feature.dtype))
    if kind in _ENCODED:
        if getattr(feature, "decode", True):
            _refuse(
                path,
                feature,
                f"decodes in Python; read it undecoded with "
                f"dataset.cast_column(name, {kind}(decode=False)) and decode it in tf_map",
            )
        return {
            "bytes": spec_lib.LeafSpec((), spec_lib.STRING),
            "path": spec_lib.LeafSpec((), spec_lib.STRING),
        }
    _refuse(path, feature, "resumeloader cannot read")
    raise AssertionError  # unreachable: _refuse raised


def accepts(source: Any) -> bool:
    """Objects of the `datasets` package (recognised by their module: no import here)."""
    return type(source).__module__.startswith("datasets.")


class HuggingFaceSource(base.Source):
    """A Hugging Face ``datasets.Dataset`` as a batched random-access source.

    Guarantees: record ``i`` is row ``i`` of the dataset; the dataset's fingerprint
    (Hugging Face's hash of its data and transforms) is an order field, so a
    checkpoint of another dataset or another transform of it is refused (as are the
    columns selected and the fill values, when given). A missing (null) value is
    never read as a number: without a fill value for its column it is a
    `RecordError` naming the column and the row.

    Args:
        dataset: a ``datasets.Dataset`` (map-style). A ``DatasetDict`` needs a split
            (``dataset["train"]``); an ``IterableDataset`` has no random access. The
            columns of ``dataset.set_format(columns=[...])`` (or ``with_format``) are
            read, the others are not.
        fill_values: column name -> the value its missing values become (for a
            struct column such as an undecoded image, a dict of its fields, e.g.
            ``{"image": {"bytes": b""}}``; an image's missing path is ``""`` unless
            declared otherwise). For a list column a scalar replaces null
            elements and a list null rows.

    Raises:
        TypeError: a split dictionary or an iterable dataset, a feature resumeloader
            cannot read, or `fill_values` naming no column.
    """

    def __init__(self, dataset: Any, *, fill_values: Mapping[str, Any] | None = None) -> None:
        kind = type(dataset).__name__
        if kind in ("DatasetDict", "IterableDatasetDict"):
            msg = (
                f"A {kind} holds several splits; pass one, e.g. dataset['train']. "
                f"Received splits: {sorted(dataset)}."
            )
            raise TypeError(msg)
        if not hasattr(dataset, "__getitems__") or not hasattr(dataset, "__len__"):
            msg = (
                f"A {kind} has no random access, so no exact resume by position. Use a "
                "map-style datasets.Dataset (load_dataset(..., streaming=False))."
            )
            raise TypeError(msg)
        features = dict(dataset.features)
        selected = _selected_columns(dataset, features)
        specs = {name: _spec(features[name], f"[{name!r}]") for name in selected}
        self._fill = _check_fill(fill_values, specs)
        # What a batch fills: the declared values, and for an encoded column (an image
        # stored as bytes) a missing path as "" (not part of the identity: no choice made)
        self._filled = dict(self._fill)
        for name in selected:
            if type(features[name]).__name__ in _ENCODED:
                given = self._fill.get(name, {})
                if isinstance(given, Mapping):
                    self._filled[name] = {"path": "", **given}
        leaves, treespec = optree.tree_flatten(
            specs,  # type: ignore[arg-type]
            is_leaf=_is_spec,
            none_is_leaf=True,
        )
        self._spec = spec_lib.RecordSpec(treespec, tuple(leaves))
        self._specs = specs
        self._dataset = dataset
        self._arrow = dataset.with_format("arrow")
        self.description = f"datasets.{kind}({len(dataset)} rows)"
        self._fields: dict[str, int | str] = {
            "num_records": len(dataset),
            "fingerprint": str(getattr(dataset, "_fingerprint", "")),
        }
        if list(selected) != list(features):
            self._fields["columns"] = ",".join(selected)
        if self._fill:
            self._fields["fill_values"] = json.dumps(self._fill, sort_keys=True, default=repr)

    def __len__(self) -> int:
        return len(self._dataset)

    def record_spec(self) -> spec_lib.RecordSpec:
        return self._spec

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    def read_batch(self, indices: np.ndarray) -> Any:
        """The rows at `indices` as NumPy columns (ragged and string leaves as lists)."""
        rows = np.asarray(indices).tolist()
        table = self._arrow[rows]
        return {
            name: arrow.column(
                table.column(name).combine_chunks(),
                spec,
                path=f"[{name!r}]",
                rows=rows,
                fill=self._filled.get(name, arrow.NO_FILL),
            )
            for name, spec in self._specs.items()
        }

    def read_many(self, indices: np.ndarray) -> list[Any]:
        columns, treespec = optree.tree_flatten(
            self.read_batch(indices),
            is_leaf=lambda x: isinstance(x, (list, np.ndarray)),
            none_is_leaf=True,
        )
        return [treespec.unflatten([c[k] for c in columns]) for k in range(len(indices))]

    def read(self, index: int) -> Any:
        return self.read_many(np.array([index], dtype=np.int64))[0]


def _selected_columns(dataset: Any, features: dict[str, Any]) -> list[str]:
    """The columns the dataset's format selects (all of them when it selects none)."""
    form = getattr(dataset, "format", None) or {}
    columns = form.get("columns")
    if columns is None or form.get("output_all_columns"):
        return list(features)
    chosen = set(columns)
    return [name for name in features if name in chosen]


def _check_fill(fill: Mapping[str, Any] | None, specs: dict[str, Any]) -> dict[str, Any]:
    if fill is None:
        return {}
    if not isinstance(fill, Mapping):
        msg = (
            "`fill_values` must be a mapping of column name -> value. Received: "
            f"{fill!r:.80} of type {type(fill).__name__}."
        )
        raise TypeError(msg)
    unknown = sorted(map(str, set(fill) - set(specs)))
    if unknown:
        msg = (
            f"`fill_values` names columns the dataset does not read: {unknown}. "
            f"Its columns: {sorted(specs)}."
        )
        raise TypeError(msg)
    return dict(fill)
