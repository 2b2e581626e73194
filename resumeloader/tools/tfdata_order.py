"""The record order of tf.data's ``list_files`` + ``interleave`` + ``shuffle(buffer)``, simulated.

What a TensorFlow user writes for files of records, the comparison the plan prints::

    files = tf.data.Dataset.list_files(pattern, shuffle=True)      # file order per epoch
    ds = files.interleave(tf.data.TFRecordDataset, cycle_length=C, block_length=L,
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(buffer_size).batch(batch_size)

`order` gives the records (indices of the files' records laid end to end) of one
epoch of it, in NumPy, from the ops' documented semantics rather than by running
tf.data, so that planning a run never imports TensorFlow (the test suite checks the
simulation against tf.data itself on an index dataset):

* ``interleave``: `cycle_length` files open at once, `block_length` records taken
  from each in turn; a file is found at its end when its turn yields nothing (or
  less than a block), which frees its slot for the next file when the cycle comes
  back to it (``deterministic=True`` is the sequential order).
* ``shuffle(buffer)``: fills a buffer of `buffer_size` records, then each output is
  a uniformly random one of the buffer's records, its place taken by the next input;
  after the last input the buffer drains in random order. The random choices differ
  from TensorFlow's generator, not their distribution: the scores are of the same
  process.

The shuffle is vectorised (the record of output ``t`` is the input that last
entered the slot chosen at ``t``: one stable sort), the interleave is a loop over
the turns of the cycle (one NumPy slice each).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["TFDataShuffle", "interleaved", "shuffled"]


@dataclasses.dataclass(frozen=True)
class TFDataShuffle:
    """The tf.data settings compared with (see the module docstring).

    Attributes:
        buffer_size: ``shuffle``'s buffer, >= 1.
        cycle_length: files read at once by ``interleave``, >= 1.
        block_length: records taken from a file per turn, >= 1.
        shuffle_files: whether ``list_files`` shuffles the files every epoch.
    """

    buffer_size: int
    cycle_length: int
    block_length: int = 1
    shuffle_files: bool = True

    def __post_init__(self) -> None:
        for name in ("buffer_size", "cycle_length", "block_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"`{name}` must be a positive integer. Received: {name}={value!r}."
                raise ValueError(msg)

    def order(self, per_file: list[int], *, seed: int, epoch: int, limit: int) -> np.ndarray:
        """The first `limit` records (int64) of epoch `epoch` for files holding `per_file`
        records each, in order (a random stream keyed by `seed` and `epoch`)."""
        rng = np.random.default_rng([seed & (2**63 - 1), epoch])
        files = np.arange(len(per_file))
        if self.shuffle_files:
            files = rng.permutation(files)
        records = interleaved(
            [per_file[f] for f in files.tolist()], self.cycle_length, self.block_length,
            limit=limit + self.buffer_size,
        )
        starts = np.concatenate([[0], np.cumsum(per_file)[:-1]]).astype(np.int64)
        file_of, number = records
        stored = starts[files[file_of]] + number
        return shuffled(stored, self.buffer_size, rng, limit=limit)

    def describe(self) -> str:
        files = "list_files(shuffle=True)" if self.shuffle_files else "list_files(shuffle=False)"
        return (
            f"tf.data {files} + interleave(cycle_length={self.cycle_length}, "
            f"block_length={self.block_length}) + shuffle({self.buffer_size})"
        )


def interleaved(
    sizes: list[int], cycle_length: int, block_length: int, *, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first `limit` outputs of interleaving files of `sizes` records: each output's
    file (its number in `sizes`) and record number in that file."""
    total = min(limit, sum(sizes))
    file_of = np.empty(total, dtype=np.int64)
    number = np.empty(total, dtype=np.int64)
    slots: list[int | None] = [None] * cycle_length  # the file read in each slot
    done = [0] * len(sizes)  # records taken from each file
    following, at, turn = 0, 0, 0
    while at < total:
        rounds = _whole_rounds(slots, turn, sizes, done, following, block_length, total - at)
        if rounds:  # whole turns of the cycle in which no file ends: one slice for all
            files, block = rounds
            count = block * files.size * block_length
            grid = np.arange(block)[:, None, None] * block_length
            grid = grid + np.asarray([done[f] for f in files.tolist()])[None, :, None]
            grid = grid + np.arange(block_length)[None, None, :]
            file_of[at : at + count] = np.broadcast_to(files[None, :, None], grid.shape).ravel()
            number[at : at + count] = grid.ravel()
            for f in files.tolist():
                done[f] += block * block_length
            at += count
            continue
        file = slots[turn]
        if file is None and following < len(sizes):
            file, following = following, following + 1
            slots[turn] = file
        if file is not None and done[file] == sizes[file]:
            slots[turn] = None  # found at its end on this visit, which yields nothing
        elif file is not None:
            take = min(block_length, sizes[file] - done[file], total - at)
            file_of[at : at + take] = file
            number[at : at + take] = np.arange(done[file], done[file] + take)
            done[file] += take
            at += take
            if take < block_length and done[file] == sizes[file]:
                slots[turn] = None  # ended within its block: the visit moves on
        turn = (turn + 1) % cycle_length
    return file_of, number


def _whole_rounds(
    slots: list[int | None], turn: int, sizes: list[int], done: list[int], following: int,
    block_length: int, left: int,
) -> tuple[np.ndarray, int] | None:
    """The files of the cycle from `turn` on and how many whole rounds they give before
    any of them ends (None when a slot is about to change, or no whole round fits)."""
    if None in slots and following < len(sizes):
        return None
    order = [slots[(turn + k) % len(slots)] for k in range(len(slots))]
    files = np.asarray([f for f in order if f is not None], dtype=np.int64)
    if not files.size:
        return None
    # A file's last (partial) block and the visit that finds its end take the careful path.
    rounds = min((sizes[f] - done[f]) // block_length for f in files.tolist())
    rounds = min(rounds, left // (files.size * block_length))
    return (files, rounds) if rounds > 0 else None


def shuffled(
    stream: np.ndarray, buffer_size: int, rng: np.random.Generator, *, limit: int
) -> np.ndarray:
    """The first `limit` outputs of a shuffle buffer of `buffer_size` over `stream`."""
    total = len(stream)
    size = min(buffer_size, total)
    steady = total - size  # outputs while inputs remain (each brings in the next input)
    choices = rng.integers(0, size, steady) if size else np.empty(0, np.int64)
    out = np.empty(min(limit, total), dtype=np.int64)
    shown = min(steady, len(out))
    # The record in slot j at output t: the input that entered at j's last choice before
    # t (input size + t'), or the slot's first record.
    order = np.argsort(choices[:shown], kind="stable")
    previous = np.full(shown, -1, dtype=np.int64)
    same = choices[order[1:]] == choices[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    fresh = previous < 0
    out[:shown][fresh] = stream[choices[:shown][fresh]]
    out[:shown][~fresh] = stream[size + previous[~fresh]]
    if len(out) > steady:  # the buffer drains in random order
        held = stream[:size].copy()
        last = np.full(size, -1, dtype=np.int64)
        np.maximum.at(last, choices, np.arange(steady))  # each slot's last choice
        entered = last >= 0
        held[entered] = stream[size + last[entered]]
        out[steady:] = rng.permutation(held)[: len(out) - steady]
    return out
