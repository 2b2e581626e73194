"""`ArraySource`: in-memory columns, an array or a dict or tuple (nested) of equal-length columns.

A column is a NumPy array, a list, or a tensor (anything with ``.numpy()``, converted
once, here); record ``i`` holds row ``i`` of every column. A list column of numbers
becomes an array, of bytes or str a string column, of arrays with different shapes a
ragged column (its records become ``tf.RaggedTensor`` batches). Dicts and tuples
are the structure, never records: a tuple of scalars, or a list of dicts inside a
column, is refused as ambiguous. A list at the top is a sequence of records (read by
`IndexableSource`), as ``tf.data.Dataset.from_tensor_slices`` would stack it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import optree

from resumeloader.core import handoff
from resumeloader.core import spec as spec_lib
from resumeloader.sources import base, digest

__all__ = ["ArraySource"]


def _is_tensor(value: Any) -> bool:
    # Duck typing: this layer imports no TensorFlow, so a tf.Tensor is recognised by
    # its .numpy() (a Keras or PyTorch tensor converts the same way).
    return not isinstance(value, np.ndarray) and callable(getattr(value, "numpy", None))


def _is_column(value: Any) -> bool:
    return isinstance(value, (np.ndarray, list)) or _is_tensor(value)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _column(value: Any, path: str) -> np.ndarray | list[np.ndarray]:
    """One column as a read-only array (first dimension: records) or a list of arrays."""
    if _is_tensor(value):
        value = value.numpy()
    if isinstance(value, np.ndarray) and value.dtype != object:
        if value.ndim == 0:
            msg = (
                f"Every column of an array `source` needs a leading record dimension. "
                f"Received: source{path} is a 0-d array ({value!r:.60})."
            )
            raise ValueError(msg)
        if value.dtype.kind in "SU":
            value = spec_lib.leaf_array(value)
        return _read_only(value)
    items = list(value)
    if not items:
        return _read_only(np.empty(0))
    if any(isinstance(item, (dict, tuple)) for item in items):
        msg = (
            f"A column holds structures, which is ambiguous: source{path} is a list of "
            f"{type(items[0]).__name__}. Pass a list of records (one structure each) or a "
            "dict or tuple of columns, not both nested."
        )
        raise ValueError(msg)
    if all(isinstance(item, (bytes, str)) for item in items):
        return _read_only(spec_lib.leaf_array(np.asarray(items, dtype=object)))
    try:  # numbers, or arrays (lists) of one shape: one array
        array = np.asarray(items)
    except ValueError:  # NumPy refuses arrays of different shapes: a ragged column
        array = None
    if array is not None and array.dtype.kind in "biufc":
        return _read_only(array)
    arrays = [spec_lib.leaf_array(item.numpy() if _is_tensor(item) else item) for item in items]
    if spec_lib.LeafSpec.covering(arrays) is None:
        kinds = sorted({spec_lib.describe_value(a) for a in arrays[:1000]})[:4]
        msg = (
            f"The records of column source{path} must share a dtype and a rank. "
            f"Received: {', '.join(kinds)}."
        )
        raise ValueError(msg)
    if len({a.shape for a in arrays}) == 1 and arrays[0].dtype != object:
        return _read_only(np.stack(arrays))
    return [_read_only(a) for a in arrays]


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{key!r}]" for key in path)


class ArraySource(base.Source):
    """Records are rows of equal-length columns; a batch is one fancy-index per array.

    Records are read-only views of the columns (a ``map_fn`` cannot change the data).
    The columns' dtypes, shapes and a sampled digest of their content
    (`resumeloader.sources.digest`: 65,536 evenly spaced elements per numeric column,
    about 2 ms for a 1 GiB array) are an order field, ``identity``: a checkpoint of
    other arrays of the same length is refused, unless they differ only between the
    sampled elements.

    Args:
        arrays: a column (NumPy array, list of values, tensor), or a dict or tuple
            (possibly nested) of columns sharing their length; see the module docstring.
    """

    def __init__(self, arrays: Any) -> None:
        values, treespec = optree.tree_flatten(arrays, is_leaf=_is_column, none_is_leaf=True)
        paths = [_path(path) for path in treespec.paths()]
        bad = [(p, v) for p, v in zip(paths, values, strict=True) if not _is_column(v)]
        if bad:
            where, value = bad[0]
            msg = (
                "A dict or tuple `source` is read as columns (arrays, lists or tensors, one "
                "row per record), so a scalar in it is ambiguous. Received: "
                f"source{where} = {value!r:.60} of type {type(value).__name__}. Pass a list "
                "for a sequence of records."
            )
            raise ValueError(msg)
        columns = [_column(v, p) for p, v in zip(paths, values, strict=True)]
        lengths = {len(column) for column in columns}
        if len(lengths) != 1:
            found = ", ".join(f"source{p}: {len(c)}" for p, c in zip(paths, columns, strict=True))
            msg = f"The columns of `source` must have equal lengths. Received lengths: {found}."
            raise ValueError(msg)
        self._columns = columns
        self._treespec = treespec
        self._length = lengths.pop()
        self.description = f"{type(arrays).__name__} of arrays"

    @staticmethod
    def accepts(source: Any) -> bool:
        """A NumPy array, a tensor, or a non-empty dict or tuple (read as columns)."""
        if isinstance(source, np.ndarray) or _is_tensor(source):
            return True
        return isinstance(source, (dict, tuple)) and bool(source)

    def __len__(self) -> int:
        return self._length

    def read(self, index: int) -> Any:
        return optree.tree_unflatten(self._treespec, [c[index] for c in self._columns])

    @property
    def batched(self) -> bool:
        return True

    def dry_read(self, indices: np.ndarray, dry: Any) -> bool:
        """Reading columns in memory sends no request: nothing to record."""
        return True

    @property
    def exact_batches(self) -> bool:
        """True for plain numeric arrays: a batch is one ``np.take`` of each, of its spec
        (an array subclass indexes its own way, so it is checked)."""
        return all(
            isinstance(c, np.ndarray) and type(c) in (np.ndarray, np.memmap)
            and c.dtype.kind in "biuf" for c in self._columns
        )

    def read_batch(self, indices: np.ndarray) -> Any:
        indices = handoff.check_indices(indices, self._length)  # once for every column
        batch = [  # fresh, aligned arrays an eager tensor may take over (core/handoff.py)
            handoff.gather(c, indices, checked=True)
            if isinstance(c, np.ndarray)
            else [c[i] for i in indices.tolist()]
            for c in self._columns
        ]
        return optree.tree_unflatten(self._treespec, batch)

    def record_spec(self) -> spec_lib.RecordSpec:
        leaves = [
            spec_lib.LeafSpec(c.shape[1:], c.dtype)
            if isinstance(c, np.ndarray)
            else spec_lib.LeafSpec.covering(c)
            for c in self._columns
        ]
        return spec_lib.RecordSpec(self._treespec, tuple(leaves))  # type: ignore[arg-type]

    @functools.cached_property
    def _identity(self) -> str:
        return digest.columns_digest(self._columns)

    def order_fields(self) -> dict[str, int | str]:
        return {"num_records": self._length, base.IDENTITY: self._identity}

    def columns(self) -> tuple[list[np.ndarray], Any] | None:
        arrays = [c for c in self._columns if isinstance(c, np.ndarray)]
        if len(arrays) != len(self._columns):
            return None
        return arrays, self._treespec
