"""`advance` with tensor ops (inside a tf.function) equals the O(1) Python arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader
from resumeloader.core import positions
from resumeloader.tfdata import graph


def _graph_advance(layout: positions.Layout, position: int, num_batches: int) -> int:
    variable = tf.Variable(position, dtype=tf.int64)
    graph.advance(variable, layout, tf.constant(num_batches, tf.int64))
    return int(variable.numpy())


@settings(max_examples=80, deadline=None)
@given(
    per_epoch=st.integers(1, 40),
    batch=st.integers(1, 50),
    drop=st.booleans(),
    num_epochs=st.one_of(st.none(), st.integers(1, 4)),
    position=st.integers(0, 200),
    num_batches=st.integers(0, 10**6),
)
def test_property_graph_advance_equals_layout_advance(
    per_epoch, batch, drop, num_epochs, position, num_batches
):
    """The tensor-op advance lands where `Layout.advance` does, from any position, and
    fails the step exactly when it would pass the end of a finite stream."""
    layout = positions.Layout(per_epoch, batch, drop, num_epochs)
    position = layout.normalise(position)  # the variable always holds a normalised position
    left = layout.batches_to_end(position)
    if left is not None and num_batches > left:
        with pytest.raises(tf.errors.InvalidArgumentError, match="past the end"):
            _graph_advance(layout, position, num_batches)
        return
    assert _graph_advance(layout, position, num_batches) == layout.advance(position, num_batches)


def test_graph_advance_huge_count_in_function_is_exact():
    """advance(10**12) inside a tf.function is a few ops, not a loop over 10**12 batches."""
    layout = positions.Layout(100, 7, True, None)
    variable = tf.Variable(0, dtype=tf.int64)
    step = tf.function(lambda n: graph.advance(variable, layout, n), autograph=False)
    step(tf.constant(10**12, tf.int64))
    assert int(variable.numpy()) == layout.advance(0, 10**12)


@pytest.mark.parametrize(
    ("num_batches", "message"),
    [(-1, "must be >= 0"), (2**62, "would pass the largest position, 2**63 - 1")],
    ids=["negative", "past-int64"],
)
def test_graph_advance_invalid_count_raises_and_keeps_position(num_batches, message):
    """A negative count, or one passing 2**63 - 1 records, fails the step; the position stays."""
    layout = positions.Layout(100, 7, True, None)
    variable = tf.Variable(14, dtype=tf.int64)
    step = tf.function(lambda n: graph.advance(variable, layout, n), autograph=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as excinfo:
        step(tf.constant(num_batches, tf.int64))
    assert message in str(excinfo.value)
    assert int(variable.numpy()) == 14


def test_loader_advance_huge_count_eager_and_in_function_agree():
    """loader.advance(10**12) eagerly and inside a tf.function land on the same position."""
    def make():
        return resumeloader.ResumableLoader(np.arange(100), batch_size=7, seed=0,
                                            drop_remainder=True)

    eager, traced = make(), make()
    eager.advance(10**12)
    tf.function(lambda: traced.advance(10**12), autograph=False)()
    assert eager.position == traced.position == (10**12 // 14) * 100 + (10**12 % 14) * 7
