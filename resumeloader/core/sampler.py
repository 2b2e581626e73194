"""`IndexSampler`: the record at any position, computed in O(1) time and memory.

The order of epoch ``e`` is a pseudo-random permutation of ``[0, num_records)``
keyed by ``(seed, e)``: an unbalanced Feistel network over the smallest power-of-two
domain that holds ``num_records``, with cycle walking back into range. A Feistel
network is a bijection whatever its round function, and cycle walking keeps it one
on any sub-range, so every epoch is a true permutation for every size (unlike
``tf.random.experimental.index_shuffle`` at N = 2**k + 1). No permutation array is
ever built, so 10**10 records cost no memory and a restore never replays history.

The arithmetic is plain integer math on fixed-width words, done with Python ints
for one index and NumPy ``uint64``/``uint32`` arrays for many: the two paths give
the same answer, on every machine, for every process.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from resumeloader.core import shard as shard_lib
from resumeloader.core import validate

__all__ = ["ALGORITHM", "IndexSampler", "epoch_hash", "permute"]

# Changing anything below changes every shuffled order: bump ALGORITHM with it.
ALGORITHM = "feistel-radix-mul-r4-v1"
_ROUNDS = 4
_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1
_SEED_TAG = 0x5EED_1DE5_0F_0D_E12
_MAX_POSITION = 2**63 - 1
_TABLE_MAX = 256


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijective, well-avalanching 64-bit mix."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=256)
def _permutation(num_records: int, seed: int, epoch: int) -> _Feistel | _Table:
    if num_records <= _TABLE_MAX:
        return _Table(num_records, epoch_hash(seed, epoch))
    return _Feistel(num_records, round_keys(seed, epoch))


def permute(num_records: int, seed: int, epoch: int, offsets: np.ndarray) -> np.ndarray:
    """The records at global `offsets` (an int64 array) of epoch `epoch`'s shuffled order.

    The permutation of ``[0, num_records)`` keyed by ``(seed, epoch)`` that every
    `IndexSampler` with these arguments follows; O(1) time per offset, no table held
    (except a 256-entry one for ``num_records <= 256``).
    """
    return _permutation(num_records, seed, epoch).array(offsets)


def permute_one(num_records: int, seed: int, epoch: int, offset: int) -> int:
    """`permute` for one offset, with Python ints."""
    return _permutation(num_records, seed, epoch).scalar(offset)


def epoch_hash(seed: int, epoch: int) -> int:
    """A 64-bit hash of (seed, epoch) that keys the epoch's permutation and derived streams."""
    # Chained, not summed, so that (s, e + 1) and (s + 1, e) are unrelated.
    return _mix64(_mix64(seed ^ _SEED_TAG) ^ epoch)


@functools.lru_cache(maxsize=256)
def round_keys(seed: int, epoch: int) -> tuple[tuple[int, int], ...]:
    """Per-round (32-bit xor key, odd 64-bit multiplier) of epoch `epoch`."""
    h = epoch_hash(seed, epoch)
    return tuple(
        (_mix64(h + 2 * i) & _M32, _mix64(h + 2 * i + 1) | 1) for i in range(_ROUNDS)
    )


class _Table:
    """A Fisher-Yates permutation of a small domain, drawn from a SplitMix64 stream.

    A 4-round Feistel network over digits this small reaches only some permutations,
    unevenly (at n = 6, 504 of 720); a table of at most _TABLE_MAX entries is O(1)
    memory and exactly uniform.
    """

    def __init__(self, n: int, key: int) -> None:
        table = list(range(n))
        for i in range(n - 1, 0, -1):
            # Multiply-shift onto [0, i]: bias below 2**-55 for i < 2**9.
            j = (_mix64(key + i) * (i + 1)) >> 64
            table[i], table[j] = table[j], table[i]
        self.table = table
        self.array_table = np.asarray(table, dtype=np.int64)

    def scalar(self, x: int) -> int:
        return self.table[x]

    def array(self, x: np.ndarray) -> np.ndarray:
        return self.array_table[x]


class _Feistel:
    """A keyed bijection of [0, p*q) with p*q >= n, walked back into [0, n).

    A word x is the pair (x // q, x % q) of digits in radices (p, q), p = ceil(sqrt(n)).
    Round i maps (left, right) to (right, (left + F(right)) mod m_i), where m_i is
    left's radix: the radices swap every round, so after an even number of rounds the
    word is (p, q) again. Each round is invertible, hence so is the network, and as
    p*q < n + p cycle walking almost never runs. F is a keyed multiplicative hash whose
    64-bit product is folded to 32 bits (high xor low, which breaks the near-linearity of a
    bare product) and mapped onto [0, m_i) by Lemire's multiply-shift (no division).
    """

    def __init__(self, n: int, keys: tuple[tuple[int, int], ...]) -> None:
        self.n = n
        self.p = math.isqrt(n - 1) + 1
        self.q = -(-n // self.p)
        self.rounds = [
            (self.p if i % 2 == 0 else self.q, xor_key, mul_key)
            for i, (xor_key, mul_key) in enumerate(keys)
        ]

    def scalar(self, x: int) -> int:
        n, q = self.n, self.q
        while True:
            left, right = divmod(x, q)
            for modulus, xor_key, mul_key in self.rounds:
                h = ((right ^ xor_key) * mul_key) & 0xFFFFFFFFFFFFFFFF
                h = left + ((((h >> 32) ^ h) & 0xFFFFFFFF) * modulus >> 32)
                left, right = right, (h - modulus if h >= modulus else h)
            x = left * q + right
            if x < n:
                return x

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = np.divmod(x, np.uint64(self.q))
        shift, mask = np.uint64(32), np.uint64(0xFFFFFFFF)
        for modulus, xor_key, mul_key in self.rounds:
            h = right ^ np.uint64(xor_key)
            h *= np.uint64(mul_key)
            h ^= h >> shift
            h &= mask
            h *= np.uint64(modulus)
            h >>= shift
            h += left
            # h < 2 * modulus; where h < modulus, h - modulus wraps above h.
            np.minimum(h, h - np.uint64(modulus), out=h)
            left, right = right, h
        left *= np.uint64(self.q)
        left += right
        return left

    def array(self, x: np.ndarray) -> np.ndarray:
        y = self._encrypt(x.astype(np.uint64))
        walking = np.flatnonzero(y >= self.n)
        while walking.size:
            z = self._encrypt(y[walking])
            y[walking] = z
            walking = walking[z >= self.n]
        return y.astype(np.int64)


class IndexSampler:
    """Maps a position in the stream of record indices to a record index.

    Position ``p`` counts this shard's records across epochs: epoch ``p //
    records_per_epoch``, offset ``p % records_per_epoch``. Shard ``s`` of ``S`` takes
    offsets ``s, s + S, s + 2S, ...`` of the epoch's global order, which does not
    depend on ``S``; each epoch drops its ``num_records % S`` tail so every shard has
    ``num_records // S`` records. Together the shards' first ``k`` positions are the
    first ``k * S`` records of the global order.

    Guarantees: each epoch is a permutation of ``[0, num_records)`` (of the kept
    prefix when sharded); the record at a position depends only on ``num_records``,
    ``seed``, ``shuffle``, the shard and the position, and is the same on any
    machine and process; ``sampler[p]`` and ``sampler.indices(a, b)`` take O(1) time
    per index and O(1) memory in ``num_records``.

    Args:
        num_records: number of records in the source, >= 1.
        seed: integer in [0, 2**64); keys every epoch's permutation.
        shuffle: False gives the natural order 0, 1, 2, ... in every epoch.
        num_epochs: number of epochs, or None for an endless stream.
        shard: the `Shard` of each epoch's global order this sampler walks; None:
            the whole order.

    Examples:
        >>> from resumeloader import Shard
        >>> sampler = IndexSampler(10, seed=0, shuffle=False, shard=Shard(1, 3))
        >>> sampler.records_per_epoch
        3
        >>> [sampler[p] for p in range(4)]
        [1, 4, 7, 1]
        >>> sampler.locate(4)
        (1, 1)
    """

    def __init__(
        self,
        num_records: int,
        *,
        seed: int,
        shuffle: bool = True,
        num_epochs: int | None = None,
        shard: shard_lib.Shard | None = None,
    ) -> None:
        self._num_records = validate.integer(
            "num_records", num_records, low=1, high=validate.MAX_COUNT
        )
        self._seed = validate.seed(seed)
        self._shuffle = validate.boolean("shuffle", shuffle)
        self._num_epochs = (
            None if num_epochs is None else validate.integer("num_epochs", num_epochs, low=1)
        )
        self._shard = shard_lib.Shard() if shard is None else shard_lib.checked(shard)
        self._shard_index, self._shard_count = self._shard.index, self._shard.count
        self._records_per_epoch = self._shard.records_per_epoch(self._num_records)
        self._end_position = self._end()
        self._last_epoch = -1
        self._last_epoch_allowed = (
            _MAX_POSITION if self._num_epochs is None else self._num_epochs - 1
        )
        self._last_permutation = _permutation(1, 0, 0)

    @property
    def num_records(self) -> int:
        """Records in the source."""
        return self._num_records

    @property
    def seed(self) -> int:
        """The seed keying every epoch."""
        return self._seed

    @property
    def shuffle(self) -> bool:
        """Whether epochs are shuffled."""
        return self._shuffle

    @property
    def num_epochs(self) -> int | None:
        """Epochs, or None if endless."""
        return self._num_epochs

    @property
    def shard(self) -> shard_lib.Shard:
        """The `Shard` of each epoch this sampler walks."""
        return self._shard

    @property
    def records_per_epoch(self) -> int:
        """This shard's records in every epoch."""
        return self._records_per_epoch

    def __repr__(self) -> str:
        return (
            f"IndexSampler(num_records={self._num_records}, seed={self._seed}, "
            f"shuffle={self._shuffle}, num_epochs={self._num_epochs}, shard={self._shard!r})"
        )

    def __len__(self) -> int:
        if self._num_epochs is None:
            msg = "An endless IndexSampler (num_epochs=None) has no length."
            raise TypeError(msg)
        return self._num_epochs * self._records_per_epoch

    def _end(self) -> int:
        if self._num_epochs is None:
            return _MAX_POSITION
        return self._num_epochs * self._records_per_epoch

    def _check_position(self, name: str, position: Any, *, stop: bool = False) -> int:
        position = validate.integer(name, position, low=0)
        end = self._end_position
        if position > end or (position == end and not stop):
            msg = (
                f"`{name}` is past the end of the sampler: positions are in [0, {end}). "
                f"Received: {name}={position}."
            )
            raise IndexError(msg)
        return position

    def locate(self, position: int) -> tuple[int, int]:
        """Returns ``(epoch, offset)`` of a position: its epoch and its place within it."""
        position = self._check_position("position", position)
        return divmod(position, self._records_per_epoch)

    def __getitem__(self, position: int) -> int:
        if type(position) is int and 0 <= position < self._end_position:
            epoch, offset = divmod(position, self._records_per_epoch)
        else:
            epoch, offset = self.locate(position)
        record = offset * self._shard_count + self._shard_index
        if not self._shuffle:
            return record
        if epoch != self._last_epoch:
            self._last_permutation = _permutation(self._num_records, self._seed, epoch)
            self._last_epoch = epoch
        return self._last_permutation.scalar(record)

    def indices(self, start: int, stop: int) -> np.ndarray:
        """Returns the record indices of positions ``[start, stop)`` as an int64 array."""
        start = self._check_position("start", start, stop=True)
        stop = self._check_position("stop", stop, stop=True)
        if stop < start:
            msg = f"`stop` must be >= `start`. Received: start={start}, stop={stop}."
            raise ValueError(msg)
        out = np.empty(stop - start, dtype=np.int64)
        length = self._records_per_epoch
        done = 0
        while start + done < stop:
            epoch, offset = divmod(start + done, length)
            count = min(length - offset, stop - start - done)
            out[done : done + count] = self.epoch_indices(epoch, offset, offset + count)
            done += count
        return out

    def epoch_indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Record indices at offsets ``[start, stop)`` of epoch `epoch` (int64)."""
        epoch = validate.integer("epoch", epoch, low=0, high=self._last_epoch_allowed)
        start = validate.integer("start", start, low=0, high=self._records_per_epoch)
        stop = validate.integer("stop", stop, low=start, high=self._records_per_epoch)
        offsets = np.arange(start, stop, dtype=np.int64)
        if self._shard_count != 1:
            offsets *= self._shard_count
            offsets += self._shard_index
        if not self._shuffle:
            return offsets
        return _permutation(self._num_records, self._seed, epoch).array(offsets)
