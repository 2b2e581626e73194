"""Arrow columns as batch leaves: NumPy in the leaf's dtype, and missing values never guessed.

`column` turns an Arrow array of ``n`` rows into the leaf (or dict of leaves) a
`LeafSpec` describes: a NumPy array of its dtype for fixed shapes, a list of bytes or
str for strings, a list of arrays for a dimension that varies. Columns without nulls
take the fast path (one conversion per column, no Python objects for numbers).

A missing value (an Arrow null, ``None`` in Python) is never turned into a number:
converted naively, a null in an ``int64`` column reads as -9223372036854775808. It
raises `MissingValueError` naming the column and the row, unless a fill value is
declared for that leaf: then a null of a scalar leaf is that value; for a list leaf a
scalar fill replaces null elements and a list replaces null rows. Duck-typed on the
pyarrow array interface: pyarrow is not imported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = ["NO_FILL", "MissingValueError", "column"]

#: No fill value is declared for a leaf: its nulls raise.
NO_FILL: Any = object()


class MissingValueError(ValueError):
    """A row holds a missing (null) value in a column with no fill value declared.

    Attributes:
        record_index: the record (row) holding it.
    """

    def __init__(self, msg: str, *, record_index: int) -> None:
        super().__init__(msg)
        self.record_index = record_index


def _storage(array: Any) -> Any:
    return getattr(array, "storage", array)  # extension arrays (Array2D, ...) hold it


def _has_nulls(array: Any) -> bool:
    """Whether `array` holds a null at any depth."""
    array = _storage(array)
    if array.null_count:
        return True
    flatten = getattr(array, "flatten", None)
    if flatten is None or (not hasattr(array, "offsets") and not hasattr(array.type, "list_size")):
        return False
    return _has_nulls(flatten())


def _missing(path: str, rows: list[int], row: int, what: str, hint: str) -> MissingValueError:
    msg = (
        f"Column {path} has a missing (null) {what} in row {rows[row]} of the dataset. "
        "Missing values are not guessed: fill them in the dataset (e.g. `dataset.map`), "
        f"or declare the value that replaces them, e.g. {hint}."
    )
    return MissingValueError(msg, record_index=rows[row])


def _fill_hint(path: str, example: str) -> str:
    keys = path.strip("[]").split("][")
    text = example
    for key in reversed(keys):
        text = f"{{{key}: {text}}}"
    return f"HuggingFaceSource(dataset, fill_values={text})"


def column(array: Any, spec: Any, *, path: str, rows: list[int], fill: Any = NO_FILL) -> Any:
    """The rows of `array` as the leaf (or dict of leaves) `spec` describes.

    Args:
        array: an Arrow array, one element per row.
        spec: a `LeafSpec`, or a dict of them for a struct column.
        path: the column's path in a record, e.g. ``['image']['path']`` (for messages).
        rows: the dataset row of each element (for messages).
        fill: the declared fill value (a dict of them for a struct), or `NO_FILL`.

    Raises:
        MissingValueError: a null with no fill value for it.
    """
    if isinstance(spec, dict):
        fields = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        # flatten(): each field with the struct's own nulls merged in.
        children = array.flatten()
        fills = fill if isinstance(fill, dict) else {}
        return {
            key: column(
                children[fields[key]],
                sub,
                path=f"{path}[{key!r}]",
                rows=rows,
                fill=fills.get(key, NO_FILL),
            )
            for key, sub in spec.items()
        }
    if _has_nulls(array):
        return _from_python(_filled(array.to_pylist(), spec, path, rows, fill), spec)
    return _fast(array, spec)


def _fast(array: Any, spec: spec_lib.LeafSpec) -> Any:
    if spec.is_string:
        if not spec.shape:
            return array.to_pylist()  # bytes or str, one per row
        return [spec_lib.leaf_array(np.asarray(row, dtype=object)) for row in array.to_pylist()]
    if not spec.shape:
        return array.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    if len(spec.shape) == 1 and hasattr(array, "flatten"):  # one level of numbers: no lists
        flat = array.flatten().to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
        if spec.shape[0] is not None:
            return flat.reshape(len(array), spec.shape[0])
        offsets = array.offsets.to_numpy()
        return np.split(flat, offsets[1:-1] - offsets[0])
    return _from_python(array.to_pylist(), spec)


def _from_python(values: list[Any], spec: spec_lib.LeafSpec) -> Any:
    if spec.is_string:
        if not spec.shape:
            return values
        return [spec_lib.leaf_array(np.asarray(row, dtype=object)) for row in values]
    if not spec.shape:
        return np.asarray(values, dtype=spec.dtype)
    rows = [np.asarray(row, dtype=spec.dtype) for row in values]
    if spec.ragged:
        return rows
    return np.stack(rows) if rows else np.empty((0, *spec.shape), spec.dtype)


def _filled(values: list[Any], spec: spec_lib.LeafSpec, path: str, rows: list[int], fill: Any):
    """`values` (Python, one per row) with every None replaced as `fill` says."""
    scalar_fill = fill is not NO_FILL and np.ndim(fill) == 0
    row_fill = fill if fill is not NO_FILL and not scalar_fill else NO_FILL
    out = []
    for row, value in enumerate(values):
        if value is None:
            if spec.shape and row_fill is not NO_FILL:
                value = row_fill
            elif not spec.shape and scalar_fill:
                value = fill
            else:
                example = "[]" if spec.shape else ("''" if spec.is_string else "0")
                raise _missing(path, rows, row, "value", _fill_hint(path, example))
        elif spec.shape:
            value = _fill_elements(value, fill if scalar_fill else NO_FILL, path, rows, row)
        out.append(value)
    return out


def _fill_elements(value: Any, fill: Any, path: str, rows: list[int], row: int) -> Any:
    if isinstance(value, list):
        return [_fill_elements(item, fill, path, rows, row) for item in value]
    if value is not None:
        return value
    if fill is NO_FILL:
        raise _missing(path, rows, row, "list element", _fill_hint(path, "0"))
    return fill
