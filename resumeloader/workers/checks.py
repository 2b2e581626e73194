"""Records and read_batch results checked against the record spec, and user errors named.

Every failure of user code (a source, a record stage) becomes a `RecordError` naming
the record index, the epoch and the position, with the original exception chained; a
record or batch that does not match the spec a `RecordSpecError` that says how it
differs. NumPy and optree only (no TensorFlow).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import spec as spec_lib

__all__ = ["batch", "batch_error", "record", "record_error", "treespec_text"]

_READ_ONLY_HINT = (
    " Records are read-only views of the source, so that a map_fn cannot change the "
    "data: copy before changing one in place (e.g. `record = record.copy()`)."
)


def record(
    spec: spec_lib.RecordSpec, record: Any, *, index: int, epoch: int, position: int
) -> list[np.ndarray]:
    """`record`'s leaves, checked against `spec`.

    Raises:
        RecordSpecError: the record does not match, naming its index, epoch and position.
    """
    fixed = spec.one_array  # the thin path: one comparison
    if (
        fixed is not None
        and type(record) is np.ndarray
        and record.dtype == fixed[0]
        and record.shape == fixed[1]
    ):
        return [record]
    problem = None
    try:
        leaves, treespec = spec_lib.flatten(record)
    except TypeError as err:
        problem = str(err)
    else:
        if treespec != spec.treespec:
            problem = f"its structure differs ({treespec_text(treespec)})"
        else:
            for number, (leaf, want) in enumerate(zip(leaves, spec.leaves, strict=True)):
                if not want.accepts(leaf):
                    path = spec.paths()[number]  # only on failure: it costs
                    got = spec_lib.describe_value(leaf)
                    problem = f"{path} is {got}, expected {want.describe()}"
                    problem += _shape_hint(want, leaf.shape, per_record=True)
                    break
    if problem is None:
        return leaves
    received = optree.tree_map(spec_lib.describe_value, record, none_is_leaf=True)
    msg = (
        f"Record index {index} (epoch {epoch}, position {position}) does not match the "
        f"element spec: {problem}. Expected: {spec.describe()}. "
        f"Received: {str(received).replace(chr(39), '')}."
    )
    raise errors.RecordSpecError(msg, record_index=index, epoch=epoch, position=position)


def batch(
    spec: spec_lib.RecordSpec, batch: Any, indices: np.ndarray, *, epoch: int, position: int,
    what: str = "read_batch",
) -> list[Any]:
    """The leaves of a source's `read_batch` result (or `what` else made the batch) for
    `indices`, checked against `spec` (a ``dense`` leaf's None dimensions may be any size).

    Raises:
        RecordSpecError: the batch does not match, naming its first record.
    """
    first, size = int(indices[0]), len(indices)
    problem = None
    try:
        columns = spec.treespec.flatten_up_to(batch)
    except (ValueError, TypeError) as err:
        problem = f"its structure differs: {err}"
        columns = []
    leaves: list[Any] = []
    fixed = spec.fixed_leaves
    for i, (column, want) in enumerate(zip(columns, spec.leaves, strict=False)):
        known = fixed[i]
        # A fixed-shape numeric leaf: one comparison of its dtype and shape.
        if (known is not None and type(column) is np.ndarray and column.dtype == known[0]
                and column.shape == (size, *known[1])):
            leaves.append(column)
            continue
        leaf, problem = _batch_leaf(column, want, size)
        if problem is not None:
            problem = f"{spec.paths()[i]}: {problem}"  # the paths only for the message
            break
        leaves.append(leaf)
    if problem is None:
        return leaves
    msg = (
        f"{what} returned a batch that does not match the element spec for the "
        f"{size} records starting at record index {first} (epoch {epoch}, position "
        f"{position}): {problem}. Expected per record: {spec.describe()}."
    )
    raise errors.RecordSpecError(msg, record_index=first, epoch=epoch, position=position)


def _batch_leaf(column: Any, want: spec_lib.LeafSpec, size: int) -> tuple[Any, str | None]:
    """A read_batch leaf as the producer needs it, or the problem with it in words."""
    try:
        if want.ragged or (want.is_string and not want.shape and isinstance(column, list)):
            if len(column) != size:
                return None, f"{len(column)} values for {size} records"
            if not want.ragged:
                bad = next((v for v in column if not _is_text(v)), None)
                if bad is not None:
                    return None, f"a record's value is {type(bad).__name__}, expected bytes or str"
                return column, None
            values = [spec_lib.leaf_array(value) for value in column]
            bad = next((v for v in values if not want.accepts(v)), None)
            if bad is not None:
                got = spec_lib.describe_value(bad)
                return None, f"a record's value is {got}, expected {want.describe()}"
            return values, None
        if want.is_string:  # not through np.asarray: it would drop trailing NUL bytes
            array = spec_lib.leaf_array(np.asarray(column, dtype=object))
        else:
            array = np.asarray(column)
    except TypeError as err:
        return None, str(err)
    shape = (size, *want.shape)
    fits = len(array.shape) == len(shape) and all(
        w is None or w == g for w, g in zip(shape, array.shape, strict=True))
    if array.dtype != want.dtype or not fits:
        got = spec_lib.LeafSpec(array.shape, array.dtype).describe()
        hint = _shape_hint(want, array.shape, per_record=False)
        return None, f"the batch is {got}, expected {size} records of {want.describe()}{hint}"
    return array, None


def _is_text(value: Any) -> bool:
    """Whether the wire format takes `value` as one string (bytes, str, or a 0-d array of one)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    return isinstance(value, (bytes, str))


def _shape_hint(want: spec_lib.LeafSpec, got: tuple[int, ...], *, per_record: bool) -> str:
    """Advice when the expected shape includes the batch dimension, or is fixed where a
    record's shape varies."""
    fits = want.shape[1:] == got if per_record else want.shape == got
    if want.shape and fits:
        return (
            " (`output_signature` describes one record, without the batch dimension: "
            f"it looks like yours includes it; try {want.shape[1:]})"
        )
    if not per_record or len(got) != len(want.shape) or not want.shape:
        return ""
    dims = tuple(w if w == g else None for w, g in zip(want.shape, got, strict=True))
    dtype = "tf.string" if want.is_string else f"tf.{want.dtype.name}"
    return (
        " (records whose arrays vary in shape need None for the dimensions that vary in "
        f"`output_signature`, e.g. tf.TensorSpec({dims}, {dtype}): their batches become "
        "tf.RaggedTensor)"
    )


def treespec_text(treespec: Any) -> str:
    """A structure in words, e.g. ``{image: *, label: *}``."""
    text = str(treespec).removeprefix("PyTreeSpec(").removesuffix(")")
    return text.removesuffix(", NoneIsLeaf").replace("'", "")


def record_error(
    what: str, err: Exception, index: int, epoch: int, position: int
) -> errors.RecordError:
    where = f"record index {index} (epoch {epoch}, position {position})"
    msg = f"{what} raised {type(err).__name__} on {where}: {err}"
    if isinstance(err, ValueError) and "read-only" in str(err):
        msg += _READ_ONLY_HINT
    return errors.RecordError(msg, record_index=index, epoch=epoch, position=position)


def batch_error(
    call: str, err: Exception, indices: np.ndarray, epoch: int, position: int,
    *, who: str | None = None,
) -> errors.RecordError:
    first = int(indices[0])
    who = who or f"The source's {call}"
    msg = (
        f"{who} raised {type(err).__name__} on the batch starting at record "
        f"index {first} (epoch {epoch}, position {position}): {err}"
    )
    # A source that knows which record failed (e.g. a checksum) says so: point at it.
    index = getattr(err, "record_index", None)
    if isinstance(index, int) and index in indices:
        position += int(np.flatnonzero(indices == index)[0])
        return errors.RecordError(msg, record_index=index, epoch=epoch, position=position)
    return errors.RecordError(msg, record_index=first, epoch=epoch, position=position)
