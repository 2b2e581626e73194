"""Tests of the block order: a permutation per epoch, windows that read few chunks, golden."""

from __future__ import annotations

import _golden
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader.core.blocks import BlockOrder

GOLDEN = _golden.BLOCKS

orders = st.builds(
    BlockOrder,
    num_records=st.integers(1, 3000),
    chunk_records=st.integers(1, 300),
    window_chunks=st.integers(1, 12),
    seed=st.integers(0, 2**64 - 1),
)


@settings(max_examples=150, deadline=None)
@given(order=orders, epoch=st.integers(0, 2**40))
def test_block_order_every_epoch_is_a_permutation(order, epoch):
    """Each epoch's records are every record exactly once."""
    records = order.indices(epoch, np.arange(order.num_records))
    assert np.array_equal(np.sort(records), np.arange(order.num_records))


@settings(max_examples=150, deadline=None)
@given(order=orders, epoch=st.integers(0, 1000))
def test_block_order_window_holds_exactly_its_chunks(order, epoch):
    """The records of window w's positions are exactly the records of its chunks."""
    records = order.indices(epoch, np.arange(order.num_records))
    size = order.window_records
    for window in range(order.num_windows):
        got = np.sort(records[window * size : (window + 1) * size])
        chunks = order.window_chunk_ids(epoch, window)
        assert len(chunks) <= order.window_chunks
        expected = np.concatenate(
            [np.arange(c * order.chunk_records,
                       min((c + 1) * order.chunk_records, order.num_records)) for c in chunks]
        )
        assert np.array_equal(got, np.sort(expected))


@settings(max_examples=80, deadline=None)
@given(order=orders, epoch=st.integers(0, 1000), data=st.data())
def test_block_order_any_offsets_match_the_whole_epoch(order, epoch, data):
    """Offsets looked up in any order and grouping give the records of the whole-epoch lookup."""
    offsets = np.asarray(
        data.draw(st.lists(st.integers(0, order.num_records - 1), min_size=1, max_size=64)),
        dtype=np.int64,
    )
    whole = order.indices(epoch, np.arange(order.num_records))
    assert np.array_equal(order.indices(epoch, offsets), whole[offsets])


def test_block_order_epochs_and_seeds_differ():
    """Another epoch or another seed gives another order (and the chunks move)."""
    a = BlockOrder(4096, chunk_records=64, window_chunks=4, seed=1)
    b = BlockOrder(4096, chunk_records=64, window_chunks=4, seed=2)
    offsets = np.arange(4096)
    e0, e1, other = a.indices(0, offsets), a.indices(1, offsets), b.indices(0, offsets)
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e0, other)
    assert a.window_chunk_ids(0, 0) != a.window_chunk_ids(1, 0)


@pytest.mark.parametrize("key", sorted(GOLDEN), ids=lambda key: "-".join(map(str, key)))
def test_block_order_golden_first_records(key):
    """The first records of a few orders are pinned (changing them is a breaking change)."""
    num_records, chunk_records, window_chunks, seed, epoch = key
    order = BlockOrder(num_records, chunk_records=chunk_records, window_chunks=window_chunks,
                       seed=seed)
    assert order.indices(epoch, np.arange(12)).tolist() == GOLDEN[key]


def test_block_order_ten_billion_records_far_into_an_epoch():
    """A 10**10-record order answers the last batch of an epoch from its window's chunks."""
    order = BlockOrder(10**10, chunk_records=1000, window_chunks=8, seed=7)
    offsets = np.arange(10**10 - 1000, 10**10, dtype=np.int64)
    records = order.indices(123, offsets)
    assert len(set(records.tolist())) == 1000
    last_window = (10**10 - 1) // order.window_records
    assert set((records // 1000).tolist()) <= set(order.window_chunk_ids(123, last_window))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_records": 0, "chunk_records": 1, "window_chunks": 1, "seed": 0}, "num_records"),
        ({"num_records": 5, "chunk_records": 0, "window_chunks": 1, "seed": 0}, "chunk_records"),
        ({"num_records": 5, "chunk_records": 2, "window_chunks": 0, "seed": 0}, "window_chunks"),
        ({"num_records": 5, "chunk_records": 2, "window_chunks": 1, "seed": -1}, "seed"),
    ],
    ids=["no-records", "no-chunk", "no-window", "negative-seed"],
)
def test_block_order_bad_argument_is_named(kwargs, message):
    """A bad argument raises naming it."""
    with pytest.raises((ValueError, TypeError)) as info:
        BlockOrder(**kwargs)
    assert f"`{message}`" in str(info.value)
