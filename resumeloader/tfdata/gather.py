"""In-memory array sources without a ``map_fn``: batches gathered inside tf.data.

For such sources Python only computes the record indices, CHUNK batches of one size
per ``from_generator`` element; tf.data gathers a chunk's records with one
``tf.gather`` per column in its own threads and splits the chunk into its batches
(``unbatch`` of a ``[batches, batch_size, ...]`` tensor), which costs much less than
converting a NumPy batch per ``from_generator`` call. The stream is identical to the
generic path: the same tasks, cut the same way.

Memory: the gather reads the NumPy arrays in place (through DLPack) when TensorFlow
can address them (C-contiguous, writeable or a read-only view of a writeable array,
native byte order, 64-byte aligned); otherwise the array is copied once into aligned
memory, and that copy is shared by every loader and iterator over the same array
(while any of them lives; a copy is matched by the array's memory, layout and
sampled content digest). There is no
size limit: nothing is embedded in a graph, and tf.data's static optimisations, whose
graph rewrite would copy every captured tensor on each new iterator, are switched
off for this dataset (its one map is parallel and ordered already).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import buffers
from resumeloader.core import spec as spec_lib
from resumeloader.sources import digest
from resumeloader.tfdata import generator, graph

__all__ = ["Gatherer"]

_KINDS = "biuf"  # bool, signed, unsigned, float
# TensorFlow's kernels assume buffers aligned to EIGEN_MAX_ALIGN_BYTES (at most 64) and
# abort the process on a misaligned one, so only such arrays are read in place.
_ALIGNMENT = 64
# Batches whose index arrays travel through from_generator together.
CHUNK = 16


def _is_spec(x: Any) -> bool:
    return isinstance(x, tf.TensorSpec)


class Gatherer:
    """Builds the gather pipeline of in-memory columns (see `supports`)."""

    def __init__(self, leaves: list[np.ndarray], treespec: Any) -> None:
        self._leaves = leaves
        self._treespec = treespec
        self._columns: list[tf.Tensor] | None = None

    @staticmethod
    def supports(leaves: list[np.ndarray], treespec: Any, spec: spec_lib.RecordSpec) -> bool:
        """Whether in-memory columns can be gathered in the graph: numeric leaves that
        match `spec`, of any size."""
        if treespec != spec.treespec:
            return False
        return all(
            leaf.dtype.kind in _KINDS and want.accepts(leaf[0])
            for leaf, want in zip(leaves, spec.leaves, strict=True)
        )

    def dataset(
        self,
        indices: Callable[[], Iterator[Any]],
        element_spec: Any,
        *,
        with_metadata: bool,
    ) -> tf.data.Dataset:
        """Batches gathered at the index arrays that `indices()` yields.

        Args:
            indices: a generator function yielding an int64 index array per batch, or
                ``(indices, metadata)`` when `with_metadata`.
            element_spec: the loader's element spec, which the batches are given.
            with_metadata: whether elements are ``(batch, metadata)``.
        """
        if self._columns is None:
            with tf.init_scope():
                self._columns = [_tensor(leaf) for leaf in self._leaves]
        columns = self._columns
        data_spec = element_spec[0] if with_metadata else element_spec
        specs = optree.tree_leaves(data_spec, is_leaf=_is_spec, none_is_leaf=True)
        index_spec = tf.TensorSpec(specs[0].shape[:1], tf.int64)
        signature = (index_spec, element_spec[1]) if with_metadata else index_spec
        treespec = self._treespec

        static = specs[0].shape[0]  # the batch size when every batch has it, else None

        def split(value: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
            """A chunk's rows [k * size, ...] as k batches [k, size, ...]."""
            rows = static if static is not None else size
            return tf.reshape(value, tf.concat([[-1, rows], tf.shape(value)[1:]], 0))

        def gather(index: tf.Tensor, size: tf.Tensor) -> Any:
            # One gather per column for the whole chunk: far less tf.data work per batch
            # than a gather per batch (a third less CPU, measured).
            batch = [
                split(tf.gather(column, index), size)
                for column, spec in zip(columns, specs, strict=True)
            ]
            return optree.tree_unflatten(treespec, batch)

        chunk_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec((None, *s.shape[1:]), s.dtype), signature
        )
        ds = tf.data.Dataset.from_generator(
            lambda: generator.guarded(lambda: _chunks(indices(), with_metadata=with_metadata)),
            output_signature=(chunk_spec, tf.TensorSpec((), tf.int64)),
        )
        if with_metadata:
            ds = ds.map(
                lambda chunk, size: (
                    gather(chunk[0], size),
                    tf.nest.map_structure(lambda m: split(m, size), chunk[1]),
                ),
                **graph.parallel_map(),
            )
        else:
            ds = ds.map(gather, **graph.parallel_map())
        ds = ds.unbatch()
        return ds.with_options(_OPTIONS)


def _options() -> tf.data.Options:
    options = tf.data.Options()
    # Any static optimisation serialises the pipeline for a graph rewrite, which copies
    # the captured columns (the whole source) once per iterator.
    options.experimental_optimization.apply_default_optimizations = False
    return options


_OPTIONS = _options()


def _tensor(leaf: np.ndarray) -> tf.Tensor:
    """`leaf` as a tensor that shares its memory, or shares that of its aligned copy."""
    leaf = _unlocked(leaf)
    if not (
        leaf.flags.c_contiguous
        and leaf.flags.writeable  # NumPy exports no read-only array through DLPack
        and leaf.dtype.isnative
        and buffers.address(leaf) % _ALIGNMENT == 0
    ):
        leaf = _shared_copy(leaf)
    # The tensor keeps `leaf` (and the memory it views) alive until it is freed.
    return tf.experimental.dlpack.from_dlpack(leaf.__dlpack__())


# (address, shape, strides, dtype, content digest) of an array -> (a weak reference to
# the array that owns that memory, a weak reference to its aligned copy). Every loader
# and iterator over one array shares one copy, alive while any of their tensors is.
_COPIES: dict[tuple[Any, ...], tuple[weakref.ref[Any], weakref.ref[np.ndarray]]] = {}
_COPIES_LOCK = threading.Lock()


def _owner(leaf: np.ndarray) -> Any:
    """The object that owns the memory `leaf` views (its last base), or `leaf`."""
    owner: Any = leaf
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner


def _shared_copy(leaf: np.ndarray) -> np.ndarray:
    """The aligned copy of `leaf` (`_aligned_copy`), made once for every loader over the
    same array: keyed by its memory, layout and sampled content (`sources.digest`),
    valid while the array that owns the memory lives."""
    owner = _owner(leaf)
    try:
        owner_ref = weakref.ref(owner)
    except TypeError:  # an owner without weak references: no sharing, one copy each
        return _aligned_copy(leaf)
    key = (leaf.ctypes.data, leaf.shape, leaf.strides, leaf.dtype.str,
           digest.columns_digest([leaf]))
    with _COPIES_LOCK:
        for stale in [k for k, (o, c) in _COPIES.items() if o() is None or c() is None]:
            del _COPIES[stale]
        entry = _COPIES.get(key)
        if entry is not None and entry[0]() is owner:
            copy = entry[1]()
            if copy is not None:
                return copy
        copy = _aligned_copy(leaf)
        _COPIES[key] = (owner_ref, weakref.ref(copy))
        return copy


def _unlocked(leaf: np.ndarray) -> np.ndarray:
    """A writeable view of the memory of `leaf`, a read-only C-contiguous view of a
    writeable array; otherwise `leaf` itself.

    `ArraySource` hands its columns out as read-only views of the user's arrays, and
    NumPy exports no read-only array through DLPack; the gather only reads them.
    """
    owner = leaf.base
    if (
        leaf.flags.writeable
        or not leaf.flags.c_contiguous
        or not isinstance(owner, np.ndarray)
        or not (owner.flags.writeable and owner.flags.c_contiguous)
    ):
        return leaf
    offset = leaf.ctypes.data - owner.ctypes.data
    if offset < 0 or offset + leaf.nbytes > owner.nbytes:
        return leaf
    return np.ndarray(leaf.shape, leaf.dtype, buffer=owner, offset=offset)


def _aligned_copy(leaf: np.ndarray) -> np.ndarray:
    """A C-contiguous, native-order copy of `leaf` starting on an _ALIGNMENT boundary."""
    dtype = leaf.dtype.newbyteorder("=")
    size = leaf.size * dtype.itemsize
    raw = np.empty(size + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    copy = raw[start : start + size].view(dtype).reshape(leaf.shape)
    np.copyto(copy, leaf)
    return copy


def _chunks(batches: Iterator[Any], *, with_metadata: bool) -> Iterator[Any]:
    """Groups up to CHUNK consecutive batches of one size (their index arrays and
    metadata) into one generator element with that size, so Python, from_generator
    and the gather run once per CHUNK batches."""
    group: list[Any] = []
    size = -1
    for item in batches:
        length = len(item[0] if with_metadata else item)
        if group and (length != size or len(group) == CHUNK):
            yield _pack(group, with_metadata), np.int64(size)
            group = []
        group.append(item)
        size = length
    if group:
        yield _pack(group, with_metadata), np.int64(size)


def _pack(group: list[Any], with_metadata: bool) -> Any:
    if with_metadata:
        index = np.concatenate([indices for indices, _ in group])
        meta = {key: np.concatenate([m[key] for _, m in group]) for key in group[0][1]}
        return index, meta
    return np.concatenate(group)
