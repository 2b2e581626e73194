"""Tests of IndexSampler: golden order, bijection, sharding, O(1) access, quality, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import _golden
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import IndexSampler, Shard

GOLDEN = _golden.SAMPLER

BIJECTION_SIZES = sorted(
    {1, 2, 3, 4, 5, 255, 256, 257, 65_537, 262_145, 1_048_577}
    | {2**k + d for k in (4, 9, 10, 15, 16, 17, 20) for d in (-1, 0, 1)}
)


@pytest.mark.parametrize(("key", "expected"), GOLDEN.items(), ids=[str(k) for k in GOLDEN])
def test_indices_golden_vectors_unchanged(key, expected):
    """The first records of an epoch are pinned for three seeds and seven sizes."""
    num_records, seed, epoch = key
    sampler = IndexSampler(num_records, seed=seed)
    start = epoch * num_records
    assert sampler.indices(start, start + len(expected)).tolist() == expected
    assert [sampler[start + i] for i in range(len(expected))] == expected


def test_indices_other_process_and_hash_seed_identical():
    """A new interpreter with another PYTHONHASHSEED computes the same order."""
    code = (
        "import json; from resumeloader import IndexSampler as S;"
        "print(json.dumps([S(n, seed=s).indices(0, 64).tolist() for n, s in"
        " [(1000, 0), (10**10, 1), (65_537, 2**64 - 1), (7, 3)]]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    here = [
        IndexSampler(n, seed=s).indices(0, 64).tolist()
        for n, s in [(1000, 0), (10**10, 1), (65_537, 2**64 - 1), (7, 3)]
    ]
    assert json.loads(out) == here


@pytest.mark.parametrize("num_records", BIJECTION_SIZES, ids=str)
def test_epoch_every_size_is_permutation(num_records):
    """Every epoch is a bijection of [0, N), including N = 2**k + 1 where index_shuffle fails."""
    sampler = IndexSampler(num_records, seed=2024)
    for epoch in (0, 3):
        order = sampler.epoch_indices(epoch, 0, num_records)
        assert np.array_equal(np.sort(order), np.arange(num_records))


@pytest.mark.parametrize("num_records", [1, 2, 3, 257, 65_537], ids=str)
def test_getitem_every_size_matches_vectorised(num_records):
    """One index at a time gives the same records as the vectorised path."""
    sampler = IndexSampler(num_records, seed=99)
    positions = range(0, 2 * num_records, max(1, num_records // 300))
    expected = sampler.indices(0, 2 * num_records)
    assert [sampler[p] for p in positions] == [int(expected[p]) for p in positions]


def test_shuffle_false_natural_order():
    """shuffle=False reads 0, 1, 2, ... in every epoch."""
    sampler = IndexSampler(5, seed=1, shuffle=False)
    assert sampler.indices(0, 12).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]


def test_epochs_consecutive_differ():
    """Consecutive epochs have different orders."""
    sampler = IndexSampler(1000, seed=5)
    assert not np.array_equal(sampler.epoch_indices(0, 0, 1000), sampler.epoch_indices(1, 0, 1000))


def test_keys_seed_plus_one_unrelated_to_epoch_plus_one():
    """(seed, epoch + 1) and (seed + 1, epoch) differ (grain's `seed + epoch` makes them equal)."""
    a = IndexSampler(1000, seed=10).epoch_indices(1, 0, 1000)
    b = IndexSampler(1000, seed=11).epoch_indices(0, 0, 1000)
    assert np.mean(a == b) < 0.02


def test_getitem_far_position_allocates_nothing_of_size_n():
    """Record 5 of epoch 10**6 of 10**10 records allocates O(1) memory."""
    sampler = IndexSampler(10**10, seed=3)
    position = 10**6 * 10**10 + 5
    tracemalloc.start()
    value = sampler[position]
    chunk = sampler.indices(position, position + 1000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0 <= value < 10**10
    assert chunk[0] == value
    assert peak < 256 * 1024


@pytest.mark.parametrize("shard_count", [2, 3, 7], ids=lambda s: f"S{s}")
def test_shards_disjoint_and_union_is_kept_prefix(shard_count):
    """Shards of an epoch are disjoint; together they are the first N - N mod S global records."""
    num_records = 1000
    global_order = IndexSampler(num_records, seed=4).epoch_indices(2, 0, num_records)
    kept = num_records - num_records % shard_count
    shards = [
        IndexSampler(num_records, seed=4, shard=Shard(s, shard_count))
        for s in range(shard_count)
    ]
    parts = [shard.epoch_indices(2, 0, shard.records_per_epoch) for shard in shards]
    assert all(len(part) == num_records // shard_count for part in parts)
    union = np.concatenate(parts)
    assert len(np.unique(union)) == kept
    assert set(union.tolist()) == set(global_order[:kept].tolist())


def test_shards_first_k_positions_are_first_k_times_s_global():
    """The shards' first k positions together are the first k*S records of the global order."""
    global_order = IndexSampler(500, seed=8).indices(0, 500)
    shards = [IndexSampler(500, seed=8, shard=Shard(s, 4)) for s in range(4)]
    interleaved = np.stack([shard.indices(0, 30) for shard in shards], axis=1).reshape(-1)
    assert np.array_equal(interleaved, global_order[:120])


def test_len_finite_and_index_past_end_raises():
    """A finite sampler has a length; the position at the end raises IndexError."""
    sampler = IndexSampler(10, seed=0, num_epochs=3, shard=Shard(0, 3))
    assert len(sampler) == 9
    assert sampler[8] >= 0
    with pytest.raises(IndexError, match="past the end") as info:
        sampler[9]
    assert "[0, 9)" in str(info.value)


def test_len_endless_raises_type_error():
    """An endless sampler has no length."""
    with pytest.raises(TypeError, match="endless"):
        len(IndexSampler(10, seed=0))


def test_locate_returns_epoch_and_offset():
    """locate splits a position into its epoch and its offset within the epoch."""
    assert IndexSampler(10, seed=0, shard=Shard(0, 3)).locate(7) == (2, 1)


def test_repr_one_line():
    """repr names the configuration on one line."""
    text = repr(IndexSampler(10, seed=3, num_epochs=2))
    assert "\n" not in text
    assert text.startswith("IndexSampler(num_records=10, seed=3")


def test_numpy_integer_arguments_accepted():
    """NumPy integers are accepted wherever ints are."""
    sampler = IndexSampler(np.int64(100), seed=np.uint64(7))
    assert sampler[np.int32(3)] == IndexSampler(100, seed=7)[3]


# -- shuffle quality ---------------------------------------------------------------------
def test_quality_first_record_lands_uniformly():
    """Where record 0 lands over 2,000 seeds is uniform: chi-square, 9 dof, p > 0.001."""
    num_records = 1000
    samplers = (IndexSampler(num_records, seed=s) for s in range(2000))
    orders = (sampler.epoch_indices(0, 0, num_records) for sampler in samplers)
    landing = [int(np.flatnonzero(order == 0)[0]) for order in orders]
    counts = np.histogram(landing, bins=10, range=(0, num_records))[0]
    expected = len(landing) / 10
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 27.88  # 99.9th percentile of chi-square with 9 degrees of freedom


@pytest.mark.parametrize("num_records", [10_000, 1_000_003], ids=str)
def test_quality_neighbours_do_not_stay_neighbours(num_records):
    """Adjacent positions hold adjacent records about as rarely as in a random permutation."""
    order = IndexSampler(num_records, seed=21).epoch_indices(0, 0, num_records)
    adjacent = int(np.sum(np.abs(np.diff(order)) == 1))
    # A random permutation has about 2 such pairs; 20 would be a structural leak.
    assert adjacent <= 20
    assert abs(np.corrcoef(order, np.arange(num_records))[0, 1]) < 0.03


def test_quality_consecutive_epochs_uncorrelated():
    """The order of epoch e + 1 is uncorrelated with that of epoch e."""
    sampler = IndexSampler(100_000, seed=13)
    first, second = sampler.epoch_indices(4, 0, 100_000), sampler.epoch_indices(5, 0, 100_000)
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.02


def test_quality_small_domain_all_permutations_reachable():
    """For N = 4 all 24 permutations occur, each about equally often over seeds."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(4800):
        key = tuple(IndexSampler(4, seed=seed).indices(0, 4).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24
    assert min(counts.values()) > 120 and max(counts.values()) < 280


# -- properties ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    num_records=st.integers(1, 3000),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 10**9),
)
def test_property_each_epoch_is_permutation(num_records, seed, epoch):
    """Any size, seed and epoch gives a permutation."""
    order = IndexSampler(num_records, seed=seed).epoch_indices(epoch, 0, num_records)
    assert np.array_equal(np.sort(order), np.arange(num_records))


@settings(max_examples=60, deadline=None)
@given(
    num_records=st.integers(1, 10**12),
    seed=st.integers(0, 2**64 - 1),
    start=st.integers(0, 10**15),
    length=st.integers(0, 40),
)
def test_property_vectorised_equals_scalar(num_records, seed, start, length):
    """indices(a, b) equals [sampler[p] for p in range(a, b)]."""
    sampler = IndexSampler(num_records, seed=seed)
    assert sampler.indices(start, start + length).tolist() == [
        sampler[p] for p in range(start, start + length)
    ]


@settings(max_examples=40, deadline=None)
@given(
    num_records=st.integers(1, 2000),
    shard_count=st.integers(1, 9),
    seed=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 1000),
)
def test_property_shards_partition_kept_records(num_records, shard_count, seed, epoch):
    """Shards are disjoint and their union is the first N - N mod S global records."""
    shard_count = min(shard_count, num_records)
    global_order = IndexSampler(num_records, seed=seed).epoch_indices(epoch, 0, num_records)
    kept = num_records - num_records % shard_count
    parts = []
    for index in range(shard_count):
        shard = IndexSampler(num_records, seed=seed, shard=Shard(index, shard_count))
        part = shard.epoch_indices(epoch, 0, shard.records_per_epoch)
        assert np.array_equal(part, global_order[index:kept:shard_count])
        parts.append(part)
    union = np.concatenate(parts)
    assert np.array_equal(np.sort(union), np.sort(global_order[:kept]))


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_records": 0}, ValueError, r"num_records.*Received: num_records=0"),
        ({"num_records": -5}, ValueError, "num_records"),
        ({"num_records": 10.0}, TypeError, "num_records.*float"),
        ({"num_records": True}, TypeError, "num_records.*bool"),
        ({"seed": True}, TypeError, "seed.*bool"),
        ({"seed": 1.5}, TypeError, "seed.*float"),
        ({"seed": -1}, ValueError, r"seed.*\[0, 18446744073709551615\]"),
        ({"seed": 2**64}, ValueError, "seed"),
        ({"shuffle": 1}, TypeError, "shuffle"),
        ({"num_epochs": 0}, ValueError, "num_epochs"),
        ({"shard": (1, 2)}, TypeError, r"`shard` must be a resumeloader.Shard.*tuple"),
        ({"num_records": 3, "shard": Shard(0, 4)}, ValueError, "shard_count.*exceed"),
    ],
    ids=[
        "zero-records", "negative-records", "float-records", "bool-records", "bool-seed",
        "float-seed", "negative-seed", "huge-seed", "int-shuffle", "zero-epochs",
        "shard-not-a-Shard", "more-shards-than-records",
    ],
)
def test_init_bad_argument_raises_clear_error(kwargs, error, match):
    """Each bad constructor argument raises an error naming it."""
    arguments = {"num_records": 10, "seed": 0, **kwargs}
    num_records = arguments.pop("num_records")
    with pytest.raises(error, match=match):
        IndexSampler(num_records, **arguments)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: s[-1], ValueError, "position"),
        (lambda s: s[1.0], TypeError, "position.*float"),
        (lambda s: s["3"], TypeError, "position.*str"),
        (lambda s: s.indices(5, 2), ValueError, "stop.*start"),
        (lambda s: s.indices(-2, 2), ValueError, "start"),
        (lambda s: s.epoch_indices(0, 0, 11), ValueError, "stop"),
        (lambda s: s.epoch_indices(-1, 0, 1), ValueError, "epoch"),
    ],
    ids=["negative", "float", "str", "reversed", "negative-start", "past-epoch", "negative-epoch"],
)
def test_positions_bad_raise_clear_error(call, error, match):
    """Non-integer, negative or reversed positions raise an error naming the argument."""
    with pytest.raises(error, match=match):
        call(IndexSampler(10, seed=0))
