"""record_rng: the cheap construction keeps the exact (seed, epoch, record) Philox keying."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader
from resumeloader.core import rng, sampler

_U64 = st.integers(0, 2**64 - 1)


def _reference(seed, epoch, index):
    """The construction of 0.1 (and of the golden vectors): Philox(key=...)."""
    key = (sampler.epoch_hash(seed ^ rng._RNG_TAG, epoch) << 64) | index
    return np.random.Generator(np.random.Philox(key=key))


@settings(max_examples=300, deadline=None)
@given(seed=_U64, epoch=st.integers(0, 2**40), index=_U64)
def test_record_rng_any_key_streams_equal_philox_key_construction(seed, epoch, index):
    """For any (seed, epoch, index) the stream equals that of Philox(key=...) bit for bit."""
    got = resumeloader.record_rng(seed, epoch, index).bit_generator.random_raw(6)
    want = _reference(seed, epoch, index).bit_generator.random_raw(6)
    assert got.tolist() == want.tolist()


def test_record_rng_numpy_integer_index_same_stream():
    """A NumPy int64 record index (what a batch's index array holds) keys the same stream."""
    got = resumeloader.record_rng(5, 1, np.int64(77)).random(4)
    assert got.tolist() == resumeloader.record_rng(5, 1, 77).random(4).tolist()


def test_record_rng_pickled_mid_stream_continues_identically():
    """A record generator pickled after some draws continues with the same draws."""
    generator = resumeloader.record_rng(3, 2, 9)
    generator.integers(0, 10, 5)
    clone = pickle.loads(pickle.dumps(generator))
    assert clone.random(3).tolist() == generator.random(3).tolist()


@pytest.mark.parametrize("index", [-1, 2**64], ids=["negative", "two-to-the-64"])
def test_record_rng_index_out_of_range_raises_value_error(index):
    """A record index outside [0, 2**64) is a ValueError naming the argument."""
    with pytest.raises(ValueError) as excinfo:
        resumeloader.record_rng(0, 0, index)
    assert f"Received: record_index={index}" in str(excinfo.value)


@pytest.mark.parametrize(
    ("n_words", "dtype"), [(2, np.uint64), (4, np.uint32)], ids=["2xuint64", "4xuint32"]
)
def test_record_rng_seed_seq_words_spell_the_record_key(n_words, dtype):
    """The generator's seed_seq reports its 128-bit key, least significant word first."""
    seed_seq = resumeloader.record_rng(11, 4, 1234).bit_generator.seed_seq
    words = seed_seq.generate_state(n_words, dtype)
    key = sum(int(word) << (i * np.dtype(dtype).itemsize * 8) for i, word in enumerate(words))
    assert words.dtype == dtype
    assert key == (sampler.epoch_hash(11 ^ rng._RNG_TAG, 4) << 64) | 1234


def test_record_rng_seed_seq_other_size_raises_value_error():
    """Asking the record key for other than 128 bits is a ValueError, not a wrong key."""
    seed_seq = resumeloader.record_rng(0, 0, 0).bit_generator.seed_seq
    with pytest.raises(ValueError) as excinfo:
        seed_seq.generate_state(3, np.uint64)
    assert "holds 128 bits" in str(excinfo.value)


def _lent(seed, epoch, index, fn):
    """What a map_fn stage does with a record's generator: lend, call, give back."""
    generator = rng.lend(seed, epoch, index)
    result = fn(generator)
    rng.give_back(generator)
    return result


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.tuples(_U64, st.integers(0, 100), _U64), min_size=1, max_size=8))
def test_lend_any_records_each_get_record_rngs_stream(keys):
    """Generators lent one after another (recycled or not) are each record's own stream."""
    for seed, epoch, index in keys:
        got = _lent(seed, epoch, index, lambda g: (g.integers(0, 9, 3), g.random(2)))
        want = resumeloader.record_rng(seed, epoch, index)
        assert got[0].tolist() == want.integers(0, 9, 3).tolist()
        assert got[1].tolist() == want.random(2).tolist()


def test_lend_generator_kept_by_user_code_is_never_reused():
    """A generator the user code kept goes on with its own stream after later lends."""
    kept = []
    _lent(1, 0, 10, lambda g: (kept.append(g), g.random())[1])
    _lent(1, 0, 11, lambda g: g.random(5))
    want = resumeloader.record_rng(1, 0, 10)
    want.random()
    assert kept[0].random(3).tolist() == want.random(3).tolist()


def test_lend_generator_whose_bit_generator_was_kept_is_never_reused():
    """Keeping only `rng.bit_generator` also keeps the generator out of reuse."""
    kept = []
    _lent(2, 0, 10, lambda g: kept.append(g.bit_generator))
    _lent(2, 0, 11, lambda g: g.random(5))
    assert kept[0].random_raw(2).tolist() == (
        resumeloader.record_rng(2, 0, 10).bit_generator.random_raw(2).tolist())


def test_lend_recycled_generator_seed_seq_names_its_record():
    """A recycled generator's seed sequence spells the new record's key."""
    _lent(4, 1, 3, lambda g: g.random())
    words = _lent(4, 1, 8, lambda g: g.bit_generator.seed_seq.generate_state(2, np.uint64))
    assert words.tolist() == [8, sampler.epoch_hash(4 ^ rng._RNG_TAG, 1)]
