"""``for batch in loader`` over in-memory columns: chunks gathered by NumPy, one view per batch.

When a batch is a gather of in-memory numeric columns (the ``graph`` and ``gather``
paths without tensor stages), the eager loop makes its batches in the loop's own
thread, a *chunk* of consecutive batches at a time: the plan's tasks of the chunk
(`Plan.tasks`, so the stream is the one every other path hands out), their record
indices checked once (`handoff.check_indices`), each column gathered once (one
``np.take``) into 64-byte aligned memory (recycled, `core/buffers.py`, when large),
and each batch's rows of it handed to an eager tensor through DLPack: a view, no copy.
A column NumPy indexes its own way (strings, an array subclass, big-endian) is indexed
as usual and each batch's rows copied by ``tf.constant``.

No producer thread: the GIL serialises a thread that gathers with the loop that
trains, and the thread's hand-over (a queue, a context switch per batch) cost more
CPU than the gather it moved, and more wall time too. No ``tf.split`` of one tensor
per chunk either: a call costs ~40 µs of eager dispatch, more than a DLPack hand-over
of every batch. The first chunk is one batch and each next one twice the last, up to
`CHUNK_BYTES` of rows (and `MAX_BATCHES` batches): the first batch after a restore
costs one batch's gather.

The consumer still counts: each batch is handed out with the position after it, and
the live loop (`resumeloader.handout.loop.EagerLoop`) advances the position as it
hands a batch out, never the chunk. A chunk's batches are all made into tensors
before its first is handed out, so the stage counters count and time a chunk at a
time: per batch only the hand-out is left (~0.08 us per int64 record in all, where
a counter per batch would cost a tenth more). A batch's tensors keep their chunk's
memory alive (it is recycled once no batch of it is left).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import buffers, handoff, meters, positions
from resumeloader.handout import engine as engine_lib
from resumeloader.handout import stream
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import prefetch
from resumeloader.workers import timing

__all__ = ["CHUNK_BYTES", "MAX_BATCHES", "batches"]

#: The most bytes of rows a chunk gathers at once (at least one batch). Chunks of 4 to
#: 16 MiB cost the same per batch within the noise, and less than chunks of one batch.
CHUNK_BYTES = 8 << 20
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
    over through DLPack when `in_place` (`_gather` said it may be, the rows are not
    empty and start 64-byte aligned, as TensorFlow's kernels require), else a copy."""
    if in_place:
        return _from_dlpack(rows.__dlpack__())
    return tf.constant(rows)


_from_dlpack = tf.experimental.dlpack.from_dlpack
_ALIGN = buffers.ALIGNMENT


def batches(
    engine: engine_lib.Engine,
    columns: list[np.ndarray],
    treespec: Any,
    position: int,
) -> Generator[tuple[Any, int], None, None]:
    """``(batch, the position after it)`` of `engine`'s plan's batches from normalised
    `position`, as eager tensors: each batch's leaves are `columns` gathered at its
    task's record indices, structured by `treespec`, paired with its metadata when the
    engine's batches are labelled. The engine's board (if any) counts each chunk of n
    batches once, as n laps through the sampler, the read, the batch stage and the
    hand-off (every batch of a chunk is made into tensors before the first is handed
    out), and times one chunk in its `every` (`meters.Place.chunk`): nothing is
    counted or timed per batch.

    Raises:
        IndexError: a record index is outside a column (checked once per chunk).
    """
    plan, labelled, board = engine.plan, engine.labelled, engine.board
    layout: positions.Layout = plan.layout
    seed = plan.pipeline.seed
    rows = len(columns[0])
    record_bytes = max(1, sum(math.prod(c.shape[1:]) * c.dtype.itemsize for c in columns))
    limit = max(1, min(MAX_BATCHES, CHUNK_BYTES // (record_bytes * max(1, layout.batch_size))))
    tasks: Iterator[plan_lib.Task] = plan.tasks(position, layout)
    place: meters.Place | None = None
    if board is not None:
        place, batch_stage = board.here(), engine.producer.names.batch
    size = 1
    while True:
        lap = None if place is None else place.chunk(timing.PRODUCE)
        chunk = list(itertools.islice(tasks, size))
        if not chunk:
            return
        size = min(limit, 2 * size)
        sizes = [len(task.indices) for task in chunk]
        indices = chunk[0].indices if len(chunk) == 1 else np.concatenate(
            [task.indices for task in chunk])
        records, count = len(indices), len(chunk)
        if lap is not None:
            assert place is not None
            lap.lap(place[timing.SAMPLER], records, batches=count)
        indices = handoff.check_indices(indices, rows)
        # Per column: the chunk's rows, whether they may be handed over, bytes per row
        # (a chunk starts aligned, so a batch does when its offset in bytes is).
        gathered = []
        for column in columns:
            out, in_place = _gather(column, indices)
            row = out.itemsize * math.prod(out.shape[1:])
            gathered.append((out, in_place and row > 0, row))
        if lap is not None:
            assert place is not None
            lap.lap(place[timing.READ], records, batches=count)
            lap.lap(place[batch_stage], records, sum(out.nbytes for out, *_ in gathered),
                    batches=count)
        del indices
        made = []
        at = 0
        for task, rows_of in zip(chunk, sizes, strict=True):
            stop = at + rows_of
            leaves = [_tensor(out[at:stop], in_place and rows_of > 0 and not at * row % _ALIGN)
                      for out, in_place, row in gathered]
            batch: Any = optree.tree_unflatten(treespec, leaves)
            if labelled:
                value, meta = stream.labelled(batch, task, None, seed=seed, with_metadata=True)
                batch = (value, prefetch.to_tensors(meta))
            made.append((batch, layout.normalise(task.position + rows_of)))
            at = stop
        if place is not None:
            place.laps(timing.PRODUCE, records, count, lap)
            if lap is not None:
                lap.lap(place[timing.HAND_OFF], records, batches=count)
        del gathered, chunk, batch, leaves
        made.reverse()  # popped from the end: a batch handed out is no longer held here
        while made:
            yield made.pop()
