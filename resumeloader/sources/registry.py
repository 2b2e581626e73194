"""Which `Source` wraps a user's object: an ordered list of adapters, first match wins.

A new kind of source is a module with a `Source` subclass and one entry here (or a
`register` call in user code); nothing else chooses between sources.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resumeloader.sources import arrays, base, huggingface, indexable, tfds

__all__ = ["adapt", "register"]

# (name, accepts(obj), build(obj) -> Source), tried in order.
_ADAPTERS: list[tuple[str, Callable[[Any], bool], Callable[[Any], base.Source]]] = [
    ("source", lambda obj: isinstance(obj, base.Source), lambda obj: obj),
    # Before "arrays": a DatasetDict is a dict.
    ("huggingface", huggingface.accepts, huggingface.HuggingFaceSource),
    ("arrays", arrays.ArraySource.accepts, arrays.ArraySource),
    ("tfds", tfds.accepts, tfds.TFDSSource),
    ("indexable", indexable.IndexableSource.accepts, indexable.IndexableSource),
]


def register(
    name: str,
    accepts: Callable[[Any], bool],
    build: Callable[[Any], base.Source],
    *,
    before: str = "indexable",
) -> None:
    """Adds an adapter, tried before the adapter named `before` (default: the generic one).

    Args:
        name: a unique name for the adapter.
        accepts: whether an object is of the kind `build` wraps.
        build: wraps such an object in a `Source`.
        before: the name of the adapter this one takes precedence over.
    """
    names = [entry[0] for entry in _ADAPTERS]
    if name in names:
        msg = f"A source adapter named {name!r} is registered already. Registered: {names}."
        raise ValueError(msg)
    if before not in names:
        msg = f"`before` must name a registered adapter. Received: before={before!r}; {names}."
        raise ValueError(msg)
    _ADAPTERS.insert(names.index(before), (name, accepts, build))


def adapt(source: Any) -> base.Source:
    """Wraps `source` in the `Source` of the first adapter that accepts it.

    Raises:
        TypeError: no adapter accepts `source` (it has no ``len()`` or ``__getitem__``).
        ValueError: `source` is empty, or its arrays have different lengths.
    """
    for _, accepts, build in _ADAPTERS:
        if accepts(source):
            adapted = build(source)
            break
    else:
        msg = (
            "`source` must be a NumPy array, a dict or tuple of equal-length arrays, or an "
            "object with `__len__` and `__getitem__(int)`. "
            f"Received: source of type {type(source).__name__}."
        )
        raise TypeError(msg)
    num_records = len(adapted)
    if num_records < 1:
        msg = f"`source` must hold at least one record. Received: len(source)={num_records}."
        raise ValueError(msg)
    return adapted
