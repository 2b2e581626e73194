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
