"""`GraphOrder`, `permute`: the record order as TensorFlow integer ops, bit-identical to NumPy's.

`permute` is `resumeloader.core.sampler.permute` and `block_indices` is
`resumeloader.core.blocks.BlockOrder.indices`, written with TensorFlow ops on
``uint64`` words (whose CPU kernels wrap modulo 2**64 like NumPy's: multiply, add,
subtract, xor, and, or, shifts, floor division, minimum), so they run inside a
`tf.function` or a `tf.data` map function: no Python, no ``from_generator``, no
state. The epoch, the offsets and the seed may be tensors (the epoch varies from
batch to batch inside a dataset); the number of records and the block shape are
Python ints, fixed when the graph is built.

The same arithmetic as the NumPy sampler, step for step:

* ``epoch_hash(seed, epoch)``: SplitMix64's finaliser, chained;
* more than 256 records: the radix Feistel network of 4 rounds (multiply, fold,
  Lemire's multiply-shift onto the round's radix) with cycle walking, as a
  ``tf.while_loop`` that re-encrypts only the words still outside ``[0, n)``;
* 256 records or fewer: the Fisher-Yates table of the epoch, built in the graph as the
  composition of its ``n - 1`` transpositions (a tree of ``log2(n)`` batched gathers,
  ``n**2`` work at most 65,536 elements), one table per distinct key in the call
  (once per epoch for the sampler, once per window and epoch for a block order).

Every epoch of every size is therefore the NumPy sampler's permutation, including the
sizes ``2**k + 1`` at which ``tf.random.experimental.index_shuffle`` is no bijection;
one checkpoint restores into either implementation. Golden vectors shared with the
NumPy tests pin both (``tests/_golden.py``).

Examples:
    >>> import numpy as np
    >>> from resumeloader.core import sampler
    >>> offsets = np.arange(5, dtype=np.int64)
    >>> permute(1000, 0, 0, offsets).numpy().tolist()
    [807, 694, 682, 639, 763]
    >>> (permute(1000, 0, 0, offsets).numpy() == sampler.permute(1000, 0, 0, offsets)).all()
    np.True_
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader.core import blocks, sampler
from resumeloader.stages import base
from resumeloader.stages import blocks as block_stage
from resumeloader.stages import sampler as sampler_stage

__all__ = [
    "ALGORITHMS",
    "GraphOrder",
    "apply_keys",
    "block_indices",
    "block_keys",
    "epoch_hash",
    "epoch_keys",
    "permute",
    "round_keys",
]

#: The versions of the NumPy orders this module implements (`Stage.algorithm`): a stage
#: of another version has no graph order (`GraphOrder.supports`), so a change there
#: cannot silently diverge from it.
ALGORITHMS = frozenset({"feistel-radix-mul-r4-v1", "blocks-feistel-v1"})

_U64 = tf.uint64
_M32 = 0xFFFFFFFF
_TABLE_MAX = 256
# The constants of resumeloader.core.sampler and .blocks: an order defined there.
_SEED_TAG = 0x5EED_1DE5_0F_0D_E12
_ROUNDS = 4
_CHUNK_TAG = 0xC4_B1_0C_5E_ED_00_00_01
_WINDOW_TAG = 0x57_1D_0E_5E_ED_00_00_02


def _no_autograph(func: Any) -> Any:
    # Plain TensorFlow ops and Python control flow on Python values: nothing for
    # autograph to convert when a tf.function or a tf.data function calls these.
    return tf.autograph.experimental.do_not_convert(func)


def _u64(value: Any) -> tf.Tensor:
    """`value` as uint64 words: Python ints taken modulo 2**64, int64 tensors bit-cast."""
    if isinstance(value, int):
        return tf.constant(value & ((1 << 64) - 1), _U64)
    value = tf.convert_to_tensor(value)
    if value.dtype == _U64:
        return value
    if value.dtype != tf.int64:
        value = tf.cast(value, tf.int64)
    return tf.bitcast(value, _U64)


def _shr(x: tf.Tensor, bits: int) -> tf.Tensor:
    return tf.bitwise.right_shift(x, tf.constant(bits, _U64))


def _mix64(z: tf.Tensor) -> tf.Tensor:
    """SplitMix64's finaliser (`resumeloader.core.sampler`), elementwise on uint64."""
    z = z + tf.constant(0x9E3779B97F4A7C15, _U64)
    z = (z ^ _shr(z, 30)) * tf.constant(0xBF58476D1CE4E5B9, _U64)
    z = (z ^ _shr(z, 27)) * tf.constant(0x94D049BB133111EB, _U64)
    return z ^ _shr(z, 31)


@_no_autograph
def epoch_hash(seed: Any, epoch: Any) -> tf.Tensor:
    """`resumeloader.core.sampler.epoch_hash` (uint64): seed and epoch ints or tensors
    (int64 or uint64, broadcast together)."""
    return _mix64(_seed_word(seed) ^ _u64(epoch))


def _seed_word(seed: Any) -> tf.Tensor:
    """The seed's half of `epoch_hash`: a constant, computed once, for a Python int."""
    if not isinstance(seed, int):
        return _mix64(_u64(seed) ^ _u64(_SEED_TAG))
    with tf.init_scope():  # eagerly, even while a graph is being built
        word = int(_mix64(_u64(seed) ^ _u64(_SEED_TAG)).numpy())
    return tf.constant(word, _U64)


@_no_autograph
def round_keys(hashes: tf.Tensor) -> tf.Tensor:
    """The Feistel rounds' keys of `epoch_hash` values (uint64, any shape ``S``): uint64
    ``[*S, 8]``, the 4 rounds' 32-bit xor keys then their odd multipliers, as
    `resumeloader.core.sampler.round_keys` makes them."""
    steps = tf.bitcast(tf.range(2 * _ROUNDS, dtype=tf.int64), _U64)
    words = _mix64(tf.expand_dims(hashes, -1) + steps)
    # NumPy arrays: a list with words of 2**63 and above would go through float64.
    masks = tf.constant(np.array([_M32] * _ROUNDS + [(1 << 64) - 1] * _ROUNDS, np.uint64))
    ones = tf.constant(np.array([0] * _ROUNDS + [1] * _ROUNDS, np.uint64))
    order = [2 * i for i in range(_ROUNDS)] + [2 * i + 1 for i in range(_ROUNDS)]
    return (tf.gather(words, order, axis=-1) & masks) | ones


@_no_autograph
def epoch_keys(num_records: int, seed: Any, epoch: Any) -> tf.Tensor:
    """What `permute` derives from (seed, epoch) before it looks at an offset: computed
    once per epoch, then applied to any number of offsets by `apply_keys`.

    For more than 256 records the Feistel rounds' keys (uint64 ``[8]``, `round_keys`);
    for 256 or fewer the epoch's Fisher-Yates table (int32 ``[num_records]``).
    """
    hashes = epoch_hash(seed, epoch)
    if num_records <= _TABLE_MAX:
        return _tables(num_records, tf.reshape(hashes, [1]))[0]
    return round_keys(hashes)


@_no_autograph
def apply_keys(num_records: int, keys: tf.Tensor, offsets: Any) -> tf.Tensor:
    """``permute(num_records, seed, epoch, offsets)`` from ``keys = epoch_keys(num_records,
    seed, epoch)``: int64 records at int64 `offsets` (any shape)."""
    offsets = tf.convert_to_tensor(offsets, tf.int64)
    if num_records <= _TABLE_MAX:
        return tf.cast(tf.gather(keys, offsets), tf.int64)
    return _feistel(num_records, keys, offsets)


@_no_autograph
def permute(num_records: int, seed: Any, epoch: Any, offsets: Any) -> tf.Tensor:
    """The records at `offsets` of epoch `epoch`'s shuffled order (int64, like `offsets`).

    `resumeloader.core.sampler.permute` in TensorFlow ops, bit for bit
    (``apply_keys(num_records, epoch_keys(num_records, seed, epoch), offsets)``).

    Args:
        num_records: the size of the permuted domain, a Python int in [1, 2**62].
        seed: an int in [0, 2**64) or a uint64/int64 tensor.
        epoch: an int or an int64 tensor, >= 0.
        offsets: int64 offsets in [0, num_records), any shape.
    """
    return apply_keys(num_records, epoch_keys(num_records, seed, epoch), offsets)


def _permute_hashed(num_records: int, hashes: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """`permute` of `offsets` from each one's epoch hash (shaped like them)."""
    if num_records <= _TABLE_MAX:
        return _table_lookup(num_records, hashes, offsets)
    return _feistel(num_records, round_keys(hashes), offsets)


def _feistel(n: int, keys: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """The keyed radix Feistel network of `resumeloader.core.sampler`, cycle walked, with
    `round_keys` `keys` (``[8]``, or ``[*offsets.shape, 8]``: a key per offset)."""
    p = math.isqrt(n - 1) + 1
    q = -(-n // p)
    parts = tf.unstack(keys, 2 * _ROUNDS, axis=-1)
    xor_keys, mul_keys = parts[:_ROUNDS], parts[_ROUNDS:]
    radix_q, limit = tf.constant(q, _U64), tf.constant(n, _U64)
    mask, shift = tf.constant(_M32, _U64), tf.constant(32, _U64)
    moduli = [tf.constant(p if i % 2 == 0 else q, _U64) for i in range(_ROUNDS)]

    def encrypt(x: tf.Tensor) -> tf.Tensor:
        left, right = x // radix_q, x % radix_q
        for modulus, xor_key, mul_key in zip(moduli, xor_keys, mul_keys, strict=True):
            h = (right ^ xor_key) * mul_key
            h = (h ^ tf.bitwise.right_shift(h, shift)) & mask
            h = tf.bitwise.right_shift(h * modulus, shift) + left
            # h < 2 * modulus; where h < modulus, h - modulus wraps above h.
            left, right = right, tf.minimum(h, h - modulus)
        return left * radix_q + right

    words = encrypt(_u64(offsets))
    if p * q > n:  # cycle walking: the words that landed outside [0, n) go round again
        words = _walk(words, limit, encrypt)
    return tf.bitcast(words, tf.int64)


def _walk(words: tf.Tensor, limit: tf.Tensor, encrypt: Any) -> tf.Tensor:
    """`words` re-encrypted until each is below `limit` (cycle walking).

    Walking is rare (a word lands outside with probability below 1/sqrt(n)), but a
    ``tf.while_loop`` or ``tf.cond`` costs a function call per use inside a tf.data
    function (measured: more than the whole network). In a graph the loop therefore
    sits behind a bare ``Switch``: when no word is outside, the loop's input is dead
    and it does not run (``Merge`` takes the untouched words), as in a lowered cond.
    """

    def more(w: tf.Tensor) -> tf.Tensor:
        return tf.reduce_any(w >= limit)

    def step(w: tf.Tensor) -> tf.Tensor:
        return tf.where(w >= limit, encrypt(w), w)

    if tf.executing_eagerly():
        while bool(more(words)):
            words = step(words)
        return words
    done, walking = tf.raw_ops.Switch(data=words, pred=more(words))
    walked = tf.while_loop(more, lambda w: [step(w)], [walking])[0]
    return tf.raw_ops.Merge(inputs=[done, walked]).output


def _mulhi_small(words: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """The high 64 bits of ``words * factor`` for ``factor < 2**32`` (uint64)."""
    mask = tf.constant(_M32, _U64)
    high, low = _shr(words, 32), words & mask
    return _shr(high * factor + _shr(low * factor, 32), 32)


def _tables(n: int, keys: tf.Tensor) -> tf.Tensor:
    """The Fisher-Yates tables of `resumeloader.core.sampler` for `keys` ([K] uint64):
    int32 [K, n], row k the table of key k, in O(n log n) work and no loop over n.

    Fisher-Yates swaps positions i and j_i for i = n-1 down to 1 (j_i <= i), so
    position x is final after step x and holds what position j_x held then. Position
    p <= t, before step t, holds p unless a later-numbered step i > t swapped it with
    position i (j_i = p); the last such is the smallest, and it brought what position i
    held before step i. So, with f(i) = the smallest i' > i with j_i' = i (a step that
    swapped position i before step i ran), what position i held before step i is the
    end of the chain i -> f(i) -> f(f(i)) ... (pointer jumping: log2(n) gathers), and
    table[x] is that end for the next step after x with j = j_x, or j_x if none.
    """
    if n == 1:
        return tf.zeros(tf.stack([tf.size(keys), 1]), tf.int32)
    steps = tf.range(1, n, dtype=tf.int64)
    words = _mix64(keys[:, None] + tf.bitcast(steps, _U64)[None, :])
    swaps = tf.cast(_mulhi_small(words, tf.bitcast(steps + 1, _U64)[None, :]), tf.int32)
    swaps = tf.pad(swaps, [[0, 0], [1, 0]])  # [K, n]: j_x; position 0 is no step (j_0 = 0)
    count = tf.shape(swaps)[0]
    base = tf.range(count)[:, None] * n  # rows of the flat [K * n] arrays
    place = tf.range(n, dtype=tf.int32)[None, :]
    # f(i) (flat), or i itself where no step swapped position i before step i.
    none = tf.int32.max  # also what an empty segment's minimum is
    earlier = tf.math.unsorted_segment_min(
        tf.where(swaps == place, none, place + base), swaps + base, count * n
    )
    earlier = tf.reshape(earlier, [-1, n])
    chain = tf.reshape(tf.where(earlier < none, earlier, place + base), [-1])
    for _ in range((n - 1).bit_length()):  # chains are shorter than n steps
        chain = tf.gather(chain, chain)
    # The steps by (j, step): each step's successor there is the next step with its j.
    order = tf.reshape(tf.argsort(swaps * n + place, axis=-1) + base, [-1, n])
    targets = tf.gather(tf.reshape(swaps, [-1]), order)
    same = targets[:, 1:] == targets[:, :-1]
    ends = tf.gather(chain, order[:, 1:]) - base
    ordered = tf.concat([tf.where(same, ends, targets[:, :-1]), targets[:, -1:]], axis=1)
    table = tf.scatter_nd(tf.reshape(order, [-1, 1]), tf.reshape(ordered, [-1]), [count * n])
    return tf.reshape(table, [-1, n])


def _table_lookup(n: int, hashes: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """`offsets` through the tables keyed by `hashes` (one per offset; one table per
    distinct hash)."""
    keys, which = tf.unique(tf.reshape(hashes, [-1]), out_idx=tf.int64)
    flat = tf.reshape(_tables(n, keys), [-1])
    rows = tf.reshape(which, tf.shape(offsets))
    return tf.cast(tf.gather(flat, rows * n + offsets), tf.int64)


@_no_autograph
def block_keys(order: blocks.BlockOrder, epoch: Any) -> tf.Tensor:
    """What `block_indices` derives from the epoch alone: the `epoch_keys` of its chunk
    order (an empty int32 tensor when no chunk is full)."""
    full = order.num_records // order.chunk_records
    if full == 0:
        return tf.zeros([0], tf.int32)
    return epoch_keys(full, sampler.epoch_hash(order.seed, _CHUNK_TAG), epoch)


@_no_autograph
def block_indices(
    order: blocks.BlockOrder, epoch: Any, offsets: Any, keys: tf.Tensor | None = None
) -> tf.Tensor:
    """`order.indices(epoch, offsets)` (`resumeloader.core.blocks.BlockOrder`) in
    TensorFlow ops, bit for bit: int64 records at int64 `offsets` (a vector) of `epoch`.

    `keys`, if given, is ``block_keys(order, epoch)`` (computed once per epoch); each
    window's own permutation is keyed by the window, so it is derived per call.
    """
    offsets = tf.convert_to_tensor(offsets, tf.int64)
    keys = block_keys(order, epoch) if keys is None else keys
    epoch = tf.convert_to_tensor(epoch, tf.int64)
    size, chunk = order.window_records, order.chunk_records
    windows = offsets // size
    within_window = offsets - windows * size
    window_seeds = epoch_hash(order.seed, _u64(_WINDOW_TAG) ^ _u64(windows))
    hashes = epoch_hash(window_seeds, epoch)
    # Every window holds `size` records but the last, which may hold fewer.
    last_window = order.num_windows - 1
    last_size = order.num_records - last_window * size
    if last_size == size:
        moved = _permute_hashed(size, hashes, within_window)
    else:
        part = tf.cast(windows == last_window, tf.int32)
        places = tf.dynamic_partition(tf.range(tf.size(offsets)), part, 2)
        pieces = [
            _permute_hashed(
                n,
                tf.dynamic_partition(hashes, part, 2)[i],
                tf.dynamic_partition(within_window, part, 2)[i],
            )
            for i, n in enumerate((size, last_size))
        ]
        moved = tf.dynamic_stitch(places, pieces)
    slots = moved // chunk + windows * order.window_chunks
    return _chunk_ids(order, keys, slots) * chunk + moved % chunk


def _chunk_ids(order: blocks.BlockOrder, keys: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
    """`BlockOrder.chunk_ids`: the chunk at `slots` of the epoch's chunk order (`keys`:
    its `block_keys`)."""
    full = order.num_records // order.chunk_records
    if full == 0:
        return tf.zeros_like(slots)
    permuted = apply_keys(full, keys, tf.minimum(slots, full - 1))
    return tf.where(slots < full, permuted, tf.constant(full, tf.int64))  # partial: last


class GraphOrder:
    """An index stage's order (`Stage.indices`) as TensorFlow ops: the natural order, the
    shuffle of a `SamplerStage` or the block order of a `BlockStage`.

    Args:
        stage: the pipeline's index stage; `supports` tells which ones are accepted.
        seed: the pipeline's seed (the one the stage's `indices` receives).

    Raises:
        TypeError: the stage's order has no graph form (a mixture, an amended pipeline).
    """

    def __init__(self, stage: base.IndexStage, *, seed: int) -> None:
        if not self.supports(stage):
            msg = (
                "This index stage's order has no TensorFlow form: only the sampler's "
                "(shuffled or not) and the block order's have one. Received: "
                f"{stage.describe()!r}."
            )
            raise TypeError(msg)
        self.stage = stage
        self.seed = seed
        self.num_records: int = stage.num_records
        self._blocks = stage.order(seed) if isinstance(stage, block_stage.BlockStage) else None

    @staticmethod
    def supports(stage: base.IndexStage) -> bool:
        """Whether `stage`'s order can be computed in the graph: a sampler or block stage
        whose algorithm is the version implemented here (`ALGORITHMS`)."""
        kinds = (sampler_stage.SamplerStage, block_stage.BlockStage)
        return type(stage) in kinds and stage.algorithm in ALGORITHMS

    @_no_autograph
    def epoch_keys(self, epoch: Any) -> tf.Tensor:
        """What the order derives from the epoch alone (`epoch_keys`, `block_keys`; an
        empty tensor for the natural order): compute it once per epoch and pass it to
        `indices` for each batch of the epoch."""
        stage = self.stage
        if self._blocks is not None:
            return block_keys(self._blocks, epoch)
        assert isinstance(stage, sampler_stage.SamplerStage)
        if not stage.shuffle:
            return tf.zeros([0], tf.int32)
        return epoch_keys(stage.num_records, self.seed, epoch)

    @_no_autograph
    def indices(self, epoch: Any, offsets: Any, keys: tf.Tensor | None = None) -> tf.Tensor:
        """The stage's record indices (int64) at global `offsets` (int64) of `epoch`: what
        ``stage.indices(epoch, offsets, seed=seed)`` returns, bit for bit.

        `keys`, if given, is ``epoch_keys(epoch)`` (computed once per epoch).
        """
        stage = self.stage
        offsets = tf.convert_to_tensor(offsets, tf.int64)
        if self._blocks is not None:
            return block_indices(self._blocks, epoch, offsets, keys)
        assert isinstance(stage, sampler_stage.SamplerStage)
        if not stage.shuffle:
            return offsets
        keys = self.epoch_keys(epoch) if keys is None else keys
        return apply_keys(stage.num_records, keys, offsets)
