"""`HuggingFaceSource`: a Hugging Face ``datasets.Dataset`` (the `datasets` extra), read by batch.

The dataset's features give the record spec before anything is read: a ``Value``
column is a scalar (strings and binaries become ``tf.string``), a ``ClassLabel`` an
int64, a ``List`` of length -1 a dimension that varies (``tf.RaggedTensor``
batches), a ``List`` of fixed length or an ``ArrayND`` a fixed dimension, a dict of
features a dict. A batch is one Arrow ``take`` of its rows, converted column by
column to NumPy in the features' own dtypes (a ``List(Value("float32"), length=16)``
column is one ``float32[16]`` leaf, not 16 scalars; ``uint8`` stays ``uint8``).
Images and audio are read undecoded (``{"bytes", "path"}``): decode them in
TensorFlow with `Pipeline.tf_map`.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np
import optree

from resumeloader.core import spec as spec_lib
from resumeloader.sources import base

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


def _column(array: Any, spec: Any) -> Any:
    """An Arrow array of n rows as the batch leaf (or dict of leaves) `spec` describes."""
    if isinstance(spec, dict):
        fields = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        return {key: _column(array.field(fields[key]), sub) for key, sub in spec.items()}
    if spec.is_string:
        if not spec.shape:
            return array.to_pylist()  # bytes or str, one per row
        return [spec_lib.leaf_array(np.asarray(row, dtype=object)) for row in array.to_pylist()]
    if not spec.shape:
        return array.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    if len(spec.shape) == 1 and hasattr(array, "flatten"):  # one level of numbers: no Python lists
        flat = array.flatten().to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
        if spec.shape[0] is not None:
            return flat.reshape(len(array), spec.shape[0])
        offsets = array.offsets.to_numpy()
        return np.split(flat, offsets[1:-1] - offsets[0])
    rows = [np.asarray(row, dtype=spec.dtype) for row in array.to_pylist()]
    return rows if spec.ragged else np.stack(rows) if rows else np.empty((0, *spec.shape))


def accepts(source: Any) -> bool:
    """Objects of the `datasets` package (recognised by their module: no import here)."""
    return type(source).__module__.startswith("datasets.")


class HuggingFaceSource(base.Source):
    """A Hugging Face ``datasets.Dataset`` as a batched random-access source.

    Guarantees: record ``i`` is row ``i`` of the dataset; the dataset's fingerprint
    (Hugging Face's hash of its data and transforms) is an order field, so a
    checkpoint of another dataset or another transform of it is refused.

    Args:
        dataset: a ``datasets.Dataset`` (map-style). A ``DatasetDict`` needs a split
            (``dataset["train"]``); an ``IterableDataset`` has no random access.
    """

    def __init__(self, dataset: Any) -> None:
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
        specs = {name: _spec(feature, f"[{name!r}]") for name, feature in dataset.features.items()}
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

    def __len__(self) -> int:
        return len(self._dataset)

    def record_spec(self) -> spec_lib.RecordSpec:
        return self._spec

    def order_fields(self) -> dict[str, int | str]:
        return dict(self._fields)

    @property
    def batched(self) -> bool:
        return True

    @property
    def reads_many(self) -> bool:
        return True

    def read_batch(self, indices: np.ndarray) -> Any:
        """The rows at `indices` as NumPy columns (ragged and string leaves as lists)."""
        table = self._arrow[np.asarray(indices).tolist()]
        return {
            name: _column(table.column(name).combine_chunks(), spec)
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
