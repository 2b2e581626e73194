"""`advance` inside a tf.function (one ``assign_add`` on the hot path) equals the O(1)
Python arithmetic, and what it cannot count fails the step."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader
from resumeloader.core import positions
from resumeloader.tfdata import position as position_lib


def _stateful_ops(function) -> list[str]:
    """The op types of `function`'s graph other than constants, casts and its inputs."""
    skip = {"Const", "Placeholder", "Identity", "NoOp"}
    return [op.type for op in function.graph.get_operations() if op.type not in skip]


def _advanced(layout: positions.Layout, start: int, counts: list[int]) -> int:
    position = position_lib.Position(layout)
    position.set(start)
    step = tf.function(position.advance, autograph=False)
    for count in counts:
        step(tf.constant(count, tf.int64))
    return position.read()


@settings(max_examples=60, deadline=None)
@given(
    per_epoch=st.integers(1, 40),
    batch=st.integers(1, 50),
    drop=st.booleans(),
    num_epochs=st.one_of(st.none(), st.integers(1, 4)),
    position=st.integers(0, 200),
    counts=st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
)
def test_property_graph_advance_equals_layout_advance(
    per_epoch, batch, drop, num_epochs, position, counts
):
    """Advances in a tf.function, read back in Python, land where `Layout.advance` does
    from any position, and fail the step exactly when they would pass the end of a
    finite stream (the position then keeps the advances before)."""
    layout = positions.Layout(per_epoch, batch, drop, num_epochs)
    start = layout.normalise(position)  # the variable always holds a normalised position
    left, expected = layout.batches_to_end(start), start
    for number, count in enumerate(counts):
        if left is not None and sum(counts[: number + 1]) > left:
            with pytest.raises(tf.errors.InvalidArgumentError, match="past the end"):
                _advanced(layout, start, counts[: number + 1])
            assert _advanced(layout, start, counts[:number]) == expected
            return
        expected = layout.advance(expected, count)
    assert _advanced(layout, start, counts) == expected


def test_graph_advance_huge_count_in_function_is_exact():
    """advance(10**12) inside a tf.function is a few ops, not a loop over 10**12 batches."""
    layout = positions.Layout(100, 7, True, None)
    assert _advanced(layout, 0, [10**12]) == layout.advance(0, 10**12)


@pytest.mark.parametrize(
    ("num_batches", "message"),
    [(-1, "must be >= 0"), (2**62, "would pass the largest position, 2**63 - 1")],
    ids=["negative", "past-int64"],
)
def test_graph_advance_invalid_count_raises_and_keeps_position(num_batches, message):
    """A negative count, or one passing 2**63 - 1 records, fails the step; the position stays."""
    position = position_lib.Position(positions.Layout(100, 7, True, None))
    position.set(14)
    step = tf.function(position.advance, autograph=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as excinfo:
        step(tf.constant(num_batches, tf.int64))
    assert message in str(excinfo.value)
    assert position.read() == 14


def test_graph_advance_endless_constant_count_is_one_assign_add():
    """On an endless stream ``advance()`` in a tf.function is one ``assign_add`` and no
    check (the readers' arithmetic checks the largest position)."""
    loader = resumeloader.ResumableLoader(np.arange(10), batch_size=4, seed=0)
    step = tf.function(lambda: loader.advance(), autograph=False).get_concrete_function()
    assert _stateful_ops(step) == ["AssignAddVariableOp"]


def test_graph_advance_finite_checks_against_the_limit_once():
    """On a finite stream it also compares the count with the batches left (one check)."""
    loader = resumeloader.ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=1)
    step = tf.function(lambda: loader.advance(), autograph=False).get_concrete_function()
    ops = _stateful_ops(step)
    assert ops.count("AssignAddVariableOp") == 1 and "LessEqual" in ops
    assert len(ops) <= 8


def test_graph_advances_read_by_state_checkpoint_and_iteration():
    """Batches advanced in graphs are in `position`, `get_state` and the next iteration."""
    loader = resumeloader.ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=3)
    step = tf.function(lambda: loader.advance(), autograph=False)
    for _ in range(4):
        step()
    assert loader.position == 14 and loader.get_state()["offset"] == 4
    fresh = resumeloader.ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=3)
    fresh.set_state(loader.get_state())
    assert [b.numpy().tolist() for b in loader.dataset()] == [
        b.numpy().tolist() for b in fresh.dataset()
    ]


def test_loader_advance_huge_count_eager_and_in_function_agree():
    """loader.advance(10**12) eagerly and inside a tf.function land on the same position."""
    def make():
        return resumeloader.ResumableLoader(np.arange(100), batch_size=7, seed=0,
                                            drop_remainder=True)

    eager, traced = make(), make()
    eager.advance(10**12)
    tf.function(lambda: traced.advance(10**12), autograph=False)()
    assert eager.position == traced.position == (10**12 // 14) * 100 + (10**12 % 14) * 7
