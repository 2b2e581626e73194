"""`BlockOrder`: a seeded shuffle whose every window of positions reads a few chunks.

A global shuffle touches records all over the data, so storage that is read by ranges
(object storage: one GET per range) serves one record per request. The block order
keeps a shuffle and reads storage in chunks: the records are cut into *chunks* of
`chunk_records` consecutive records; each epoch permutes the chunks; consecutive runs
of `window_chunks` chunks of that order form *windows*, and the records of a window
are permuted among its positions. Positions ``[w * W * C, (w + 1) * W * C)`` of an
epoch therefore hold exactly the records of window ``w``'s chunks, so a consumer that
fetches a window's chunks (one ranged read each) has every record of its positions.

Everything is a pure function of (num_records, chunk_records, window_chunks, seed,
epoch, offset), O(1) per offset, no table held: two Feistel permutations
(`resumeloader.core.sampler.permute`), one over the epoch's full chunks and one over
the window's records. A last, partial chunk (``num_records % chunk_records`` records)
is the epoch's last chunk, so every window but the last holds exactly
``window_chunks * chunk_records`` records.

How far a record moves: its chunk goes anywhere in the epoch (uniformly, at chunk
granularity), and inside its window it lands on any of the window's positions. Two
records of one chunk stay within one window of each other (``window_chunks *
chunk_records`` positions) — the trade-off against a global shuffle, like tf.data's
``shuffle(buffer_size)``, whose records move at most about ``buffer_size`` positions
forward and are correlated with their neighbours in the input in the same way.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from resumeloader.core import sampler, validate

__all__ = ["ALGORITHM", "BlockOrder"]

# Changing anything below changes every block order: bump ALGORITHM with it.
ALGORITHM = "blocks-feistel-v1"
_CHUNK_TAG = 0xC4_B1_0C_5E_ED_00_00_01
_WINDOW_TAG = 0x57_1D_0E_5E_ED_00_00_02
_M64 = (1 << 64) - 1


def _subseed(seed: int, tag: int) -> int:
    return sampler.epoch_hash(seed, tag) & _M64


@dataclasses.dataclass(frozen=True)
class BlockOrder:
    """The block order of ``[0, num_records)`` for every epoch (see the module docstring).

    Guarantees: each epoch is a permutation of ``[0, num_records)``; the records at
    offsets ``[w * window_records, (w + 1) * window_records)`` of an epoch are exactly
    those of the chunks `window_chunk_ids` ``(epoch, w)`` names; the record at an
    offset depends only on the five arguments, the epoch and the offset, on any
    machine and process.

    Args:
        num_records: records in an epoch, >= 1.
        chunk_records: consecutive records per chunk, >= 1.
        window_chunks: chunks per window, >= 1 (records move within a window).
        seed: integer in [0, 2**64).

    Examples:
        >>> import numpy as np
        >>> order = BlockOrder(10, chunk_records=3, window_chunks=2, seed=0)
        >>> records = order.indices(0, np.arange(10))
        >>> sorted(records.tolist()) == list(range(10))
        True
        >>> sorted(set((records[:6] // 3).tolist())) == sorted(order.window_chunk_ids(0, 0))
        True
    """

    num_records: int
    chunk_records: int
    window_chunks: int
    seed: int

    def __post_init__(self) -> None:
        validate.integer("num_records", self.num_records, low=1, high=validate.MAX_COUNT)
        validate.integer("chunk_records", self.chunk_records, low=1, high=validate.MAX_COUNT)
        validate.integer("window_chunks", self.window_chunks, low=1, high=validate.MAX_COUNT)
        validate.seed(self.seed)

    @property
    def num_chunks(self) -> int:
        """Chunks in an epoch (the last one partial when `chunk_records` does not divide)."""
        return -(-self.num_records // self.chunk_records)

    @property
    def window_records(self) -> int:
        """Positions per window (the epoch's last window may hold fewer)."""
        return self.window_chunks * self.chunk_records

    @property
    def num_windows(self) -> int:
        """Windows in an epoch."""
        return -(-self.num_chunks // self.window_chunks)

    def chunk_ids(self, epoch: int, slots: np.ndarray) -> np.ndarray:
        """The chunk at each of `slots` (int64) of epoch `epoch`'s chunk order."""
        full = self.num_records // self.chunk_records
        slots = np.asarray(slots, dtype=np.int64)
        out = np.full(slots.shape, full, dtype=np.int64)  # the partial chunk, last
        permuted = slots < full
        if full and permuted.any():
            seed = _subseed(self.seed, _CHUNK_TAG)
            out[permuted] = sampler.permute(full, seed, epoch, slots[permuted])
        return out

    def window_chunk_ids(self, epoch: int, window: int) -> list[int]:
        """The chunks whose records fill window `window` of epoch `epoch`, in slot order."""
        first = window * self.window_chunks
        last = min(first + self.window_chunks, self.num_chunks)
        return self.chunk_ids(epoch, np.arange(first, last, dtype=np.int64)).tolist()

    def indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        """The record indices (int64) at `offsets` (int64, in [0, num_records)) of `epoch`."""
        offsets = np.asarray(offsets, dtype=np.int64)
        size, chunk = self.window_records, self.chunk_records
        windows = offsets // size
        out = np.empty(offsets.shape, dtype=np.int64)
        for window in np.unique(windows).tolist():
            here = windows == window
            start = window * size
            records = min(size, self.num_records - start)
            seed = _subseed(self.seed, _WINDOW_TAG ^ window)
            moved = sampler.permute(records, seed, epoch, offsets[here] - start)
            slots, within = np.divmod(moved, chunk)
            slots += window * self.window_chunks
            out[here] = self.chunk_ids(epoch, slots) * chunk + within
        return out
