"""The stream of batch tasks a loader produces from a position, and per-record metadata.

Pure Python and NumPy: which records each batch holds is decided here, before any
worker, thread or tf.data stage touches them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from resumeloader import _position, _sampler, _workers

__all__ = ["metadata", "tasks"]

_METADATA_SEED_TAG = 0x7F5EED

# Indices computed per sampler call: amortises its per-call cost (~0.15 ms) over many
# batches instead of paying it for each one.
_INDEX_CHUNK = 8192


def tasks(
    sampler: _sampler.IndexSampler, layout: _position.Layout, position: int
) -> Iterator[_workers.Task]:
    """One task per batch from normalised `position` on: its indices, epoch and position."""
    end = layout.end
    per_epoch = layout.records_per_epoch
    chunk, chunk_epoch, chunk_start = np.empty(0, np.int64), -1, 0
    while end is None or position < end:
        stop = layout.batch_end(position)
        epoch, offset = divmod(position, per_epoch)
        first, last = offset - chunk_start, offset - chunk_start + stop - position
        if epoch != chunk_epoch or first < 0 or last > len(chunk):
            chunk_stop = min(per_epoch, offset + max(stop - position, _INDEX_CHUNK))
            chunk = sampler.epoch_indices(epoch, offset, chunk_stop)
            chunk_epoch, chunk_start, first, last = epoch, offset, 0, stop - position
        yield _workers.Task(chunk[first:last], epoch, position)
        position = layout.normalise(stop)




def metadata(seed: int, task: _workers.Task) -> dict[str, np.ndarray]:
    """Per-record index, epoch, position and a stateless TF seed pair of a batch."""
    count = len(task.indices)
    seeds = np.empty((count, 2), dtype=np.int64)
    seeds[:, 0] = np.int64(_sampler.epoch_hash(seed ^ _METADATA_SEED_TAG, task.epoch) >> 1)
    seeds[:, 1] = task.indices
    return {
        "index": task.indices,
        "epoch": np.full(count, task.epoch, dtype=np.int64),
        "position": np.arange(task.position, task.position + count, dtype=np.int64),
        "seed": seeds,
    }
