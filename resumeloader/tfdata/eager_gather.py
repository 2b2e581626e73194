"""``for batch in loader`` over in-memory columns: chunks gathered by NumPy, split per batch.

When a batch is a gather of in-memory numeric columns (the ``graph`` path without
tensor stages), the eager loop makes its batches in the loop's own thread, a *chunk*
of consecutive batches at a time: the plan's tasks of the chunk (`Plan.tasks`, so the
stream is the one every other path hands out), their record indices checked once
(`handoff.check_indices`), each column gathered once into recycled aligned memory
(`core/buffers.py`) that one eager tensor takes over through DLPack (a small leaf is
copied by ``tf.constant``), and that tensor cut into the chunk's batches by one
``tf.split`` (views of it, no copy). Per batch only the hand-out remains.

No producer thread: the GIL serialises a thread that gathers with the loop that
trains, and the thread's hand-over (a queue, a context switch per batch) cost more
CPU than the gather it moved, and more wall time too. The first chunk is one batch
and each next one twice the last, up to `CHUNK_BYTES` of rows (and `MAX_BATCHES`
batches): the first batch after a restore costs one batch's gather.

The consumer still counts: each batch is handed out with the position after it, and
the live loop (`resumeloader.handout.loop.EagerLoop`) advances the position as it
hands a batch out, never the chunk.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import buffers, handoff, positions
from resumeloader.handout import stream
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import prefetch

__all__ = ["CHUNK_BYTES", "MAX_BATCHES", "batches"]

#: The most bytes of rows a chunk gathers at once (at least one batch): a few MiB keep
#: the gather's writes in the cache the loop reads them from.
CHUNK_BYTES = 4 << 20
#: The most batches in a chunk.
MAX_BATCHES = 32


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array aligned to `buffers.ALIGNMENT`: pooled when
    large (`buffers.empty`), else a small allocation of its own."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= buffers.MIN_BYTES:
        return buffers.empty(shape, dtype)
    raw = np.empty(nbytes + buffers.ALIGNMENT, np.uint8)
    start = -buffers.address(raw) % buffers.ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _gather(column: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, bool]:
    """``column[indices]`` (indices checked), and whether its batches may be handed to
    TensorFlow in place: a plain numeric column gathered into fresh aligned memory no
    one else holds."""
    if (column.dtype.kind not in "iuf" or not column.dtype.isnative
            or type(column) not in (np.ndarray, np.memmap)):
        return column[indices], False
    out = _aligned((len(indices), *column.shape[1:]), column.dtype)
    np.take(column, indices, axis=0, out=out, mode="clip")
    return out, True


def _tensor(rows: np.ndarray, in_place: bool) -> Any:
    """The eager tensor of one batch's `rows` of a chunk: the chunk's memory handed
    over through DLPack when it may be (`_gather`) and the rows start 64-byte aligned
    (TensorFlow's kernels require it), else a copy."""
    if in_place and rows.size and not buffers.address(rows) % buffers.ALIGNMENT:
        return _from_dlpack(rows.__dlpack__())
    return tf.constant(rows)


_from_dlpack = tf.experimental.dlpack.from_dlpack


def batches(
    plan: plan_lib.Plan,
    columns: list[np.ndarray],
    treespec: Any,
    position: int,
    *,
    labelled: bool,
) -> Generator[tuple[Any, int], None, None]:
    """``(batch, the position after it)`` of `plan`'s batches from normalised `position`,
    as eager tensors: each batch's leaves are `columns` gathered at its task's record
    indices, structured by `treespec`, paired with its metadata when `labelled`.

    Raises:
        IndexError: a record index is outside a column (checked once per chunk).
    """
    layout: positions.Layout = plan.layout
    seed = plan.pipeline.seed
    rows = len(columns[0])
    record_bytes = max(1, sum(math.prod(c.shape[1:]) * c.dtype.itemsize for c in columns))
    limit = max(1, min(MAX_BATCHES, CHUNK_BYTES // (record_bytes * max(1, layout.batch_size))))
    tasks: Iterator[plan_lib.Task] = plan.tasks(position, layout)
    size = 1
    while True:
        chunk = list(itertools.islice(tasks, size))
        if not chunk:
            return
        size = min(limit, 2 * size)
        sizes = [len(task.indices) for task in chunk]
        indices = chunk[0].indices if len(chunk) == 1 else np.concatenate(
            [task.indices for task in chunk])
        indices = handoff.check_indices(indices, rows)
        gathered = [_gather(column, indices) for column in columns]
        del indices
        at = 0
        for task, count in zip(chunk, sizes, strict=True):
            stop = at + count
            leaves = [_tensor(out[at:stop], in_place) for out, in_place in gathered]
            batch = optree.tree_unflatten(treespec, leaves)
            if labelled:
                value, meta = stream.labelled(batch, task, None, seed=seed, with_metadata=True)
                batch = (value, prefetch.to_tensors(meta))
            at = stop
            yield batch, layout.normalise(task.position + count)
        del gathered, chunk

