"""The plan's shuffle scores on orders whose quality is known, and the simulated tf.data
order (``list_files`` + ``interleave`` + ``shuffle``) against tf.data itself."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline
from resumeloader.stages import plan as plan_lib
from resumeloader.tools import plan as plan_tool
from resumeloader.tools import shuffle_score, tfdata_order

N, BATCH = 20_000, 50


def _scores(pipeline: Pipeline, *, buffer_size: int = 1000) -> dict:
    plan = plan_lib.Plan(pipeline.batch(BATCH), num_epochs=None)
    compared = tfdata_order.TFDataShuffle(buffer_size, cycle_length=1, shuffle_files=False)
    steps = (0, plan.layout.batches_per_epoch)
    return plan_tool.score_orders(plan, steps, compared)


def test_score_of_the_natural_order_is_unshuffled():
    """Records in storage order: nothing moved, a run of neighbours in one batch: 0."""
    score = _scores(Pipeline(np.arange(N), seed=0).shuffle(False))["ours"]
    assert (score.moved, score.spread, score.score) == (0.0, 1.0, 0.0)


def test_score_of_the_global_shuffle_is_near_the_ideal():
    """A uniformly random permutation scores about 1 on both sides."""
    score = _scores(Pipeline(np.arange(N), seed=0).shuffle())["ours"]
    assert score.score > 0.97 and score.moved < 1.03 and score.mixed < 1.03
    assert score.ideal_spread == pytest.approx(shuffle_score.ideal_spread(N, BATCH, BATCH))


def test_score_of_the_block_order_lies_between():
    """Chunks move anywhere (moved ~1), but a chunk's records stay in one window of
    batches: mixed, and so the score, well below the global shuffle's and above 0."""
    ours = _scores(Pipeline(np.arange(N), seed=0).shuffle(chunk_records=100, window_chunks=4))
    score = ours["ours"]
    assert score.moved > 0.9
    assert 0.05 < score.score < 0.5
    assert score.spread < 400 / BATCH + 1  # a window of 4 chunks holds 400 records: 8 batches


def test_score_of_a_small_shuffle_buffer_moves_records_little():
    """tf.data's shuffle(buffer) over storage order moves records about a buffer's length."""
    theirs = _scores(Pipeline(np.arange(N), seed=0), buffer_size=500)["tf"]
    assert theirs.moved < 0.1 and theirs.score < 0.1
    assert theirs.mixed > 0.05  # it does mix neighbours into ~buffer/batch batches


def test_ideal_spread_of_one_batch_per_epoch_is_one():
    """With a single batch every run lies in it."""
    assert shuffle_score.ideal_spread(100, 100, 10) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("sizes", "cycle", "block"),
    [([7, 3, 12, 5, 9], 2, 1), ([7, 3, 12, 5, 9], 3, 2), ([40, 1, 1, 40], 4, 3), ([5], 4, 2),
     ([4, 4, 6, 2], 2, 2), ([1, 2, 3, 4, 5, 6, 7, 30], 3, 4), ([50] * 6, 4, 5)],
    ids=["cycle-2", "cycle-3-blocks-2", "short-files", "more-slots-than-files",
         "whole-blocks", "blocks-longer-than-files", "equal-files-whole-rounds"],
)
def test_simulated_interleave_is_tf_data_interleave(sizes, cycle, block):
    """The simulated interleave is tf.data's deterministic interleave, element for element."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    files = tf.data.Dataset.from_tensor_slices((starts, np.asarray(sizes, np.int64)))
    got = files.interleave(
        lambda start, size: tf.data.Dataset.range(start, start + size),
        cycle_length=cycle, block_length=block, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    file_of, number = tfdata_order.interleaved(sizes, cycle, block, limit=sum(sizes))
    assert (starts[file_of] + number).tolist() == list(got.as_numpy_iterator())


def test_simulated_shuffle_scores_as_tf_data_shuffle():
    """The simulated shuffle buffer and tf.data's (seeded) give the same figures within a
    few percent, and neither hands out a record more than a buffer before its turn."""
    size, buffer = 20_000, 700
    real = np.fromiter(
        tf.data.Dataset.range(size).shuffle(buffer, seed=3).as_numpy_iterator(), np.int64
    )
    simulated = tfdata_order.shuffled(np.arange(size), buffer, np.random.default_rng(3),
                                      limit=size)
    assert sorted(simulated.tolist()) == list(range(size))
    for order in (real, simulated):
        assert (order - np.arange(size)).max() <= buffer - 1
    figures = []
    for order in (real, simulated):
        counter = shuffle_score.ScoreCounter(size, BATCH)
        for at in range(0, size, BATCH):
            counter.add(np.arange(at, at + BATCH), order[at : at + BATCH])
        figures.append(counter.result())
    assert figures[1].moved == pytest.approx(figures[0].moved, rel=0.05)
    assert figures[1].mixed == pytest.approx(figures[0].mixed, rel=0.05)


def test_score_counter_without_batches_raises():
    """An empty range has no score."""
    with pytest.raises(ValueError, match="No batch was scored"):
        shuffle_score.ScoreCounter(10, 2).result()
