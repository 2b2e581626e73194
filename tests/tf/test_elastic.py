"""Elastic resume: a checkpoint of 2 shards continues the global stream exactly with another
shard count, another global batch, or under tf.distribute; impossible layouts are errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import resumeloader

pytestmark = pytest.mark.usefixtures("clean_keras")

NUM_RECORDS = 1000  # divisible by every shard count used, so no epoch tail is dropped
NUM_EPOCHS = 2
SEED = 9


def make_shards(shard_count: int, global_batch: int, **overrides):
    """One loader per shard, each with its share of the global batch."""
    return [
        resumeloader.ResumableLoader(
            np.arange(NUM_RECORDS),
            batch_size=global_batch // shard_count,
            seed=SEED,
            num_epochs=NUM_EPOCHS,
            shard=resumeloader.Shard(index, shard_count),
            prefetch=None,
            **overrides,
        )
        for index in range(shard_count)
    ]


def global_steps(shards, num_steps=None) -> list[list[int]]:
    """Sorted records of each global step: batch t of every shard together."""
    iterators = [iter(shard) for shard in shards]
    steps = []
    while num_steps is None or len(steps) < num_steps:
        batches = [next(it, None) for it in iterators]
        if all(b is None for b in batches):
            break
        assert all(b is not None for b in batches), "shards must end together"
        steps.append(sorted(np.concatenate([b.numpy() for b in batches]).tolist()))
    return steps


def expected_steps(global_batch: int, epoch: int = 0, offset: int = 0) -> list[list[int]]:
    """The global order from (epoch, global offset), cut into global batches per epoch."""
    order = resumeloader.IndexSampler(NUM_RECORDS, seed=SEED)
    steps = []
    for e in range(epoch, NUM_EPOCHS):
        start = offset if e == epoch else 0
        for a in range(start, NUM_RECORDS, global_batch):
            b = min(a + global_batch, NUM_RECORDS)
            steps.append(sorted(order.epoch_indices(e, a, b).tolist()))
    return steps


def save(shards, directory) -> list[str]:
    return [
        tf.train.Checkpoint(loader=shard).write(str(directory / f"shard-{i}"))
        for i, shard in enumerate(shards)
    ]


def restore(shards, path: str) -> None:
    for shard in shards:
        tf.train.Checkpoint(loader=shard).read(path).assert_consumed()


@pytest.mark.parametrize(
    ("new_shards", "new_batch"),
    [(1, 64), (4, 64), (2, 48), (4, 96)],
    ids=["to-1-shard", "to-4-shards", "other-batch-48", "4-shards-batch-96"],
)
@pytest.mark.parametrize("steps_before", [5, 16, 20], ids=["mid-epoch", "boundary", "epoch-1"])
def test_resume_two_shard_checkpoint_with_new_layout_continues_global_stream(
    tmp_path, new_shards, new_batch, steps_before
):
    """2 shards x 32 (global 64) checkpointed, resumed with another layout: exact continuation."""
    shards = make_shards(2, 64)
    before = global_steps(shards, steps_before)
    assert before == expected_steps(64)[:steps_before]
    paths = save(shards, tmp_path)
    state = shards[0].get_state()
    assert shards[1].get_state() == state  # the global position is the same on every shard
    resumed = make_shards(new_shards, new_batch)
    restore(resumed, paths[0])
    after = global_steps(resumed)
    assert after == expected_steps(new_batch, state["epoch"], state["offset"])
    consumed = [r for step in before + after for r in step]
    assert sorted(consumed) == sorted(list(range(NUM_RECORDS)) * NUM_EPOCHS)


def test_resume_two_shard_checkpoint_under_mirrored_strategy_continues_global_stream(tmp_path):
    """2 plain shards checkpointed, resumed as one loader fed to 2 replicas: exact continuation."""
    shards = make_shards(2, 64)
    before = global_steps(shards, 5)
    path = save(shards, tmp_path)[1]
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        (loader,) = make_shards(1, 64, drop_remainder=True)
    restore([loader], path)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: loader.dataset(input_context=ctx)
    )
    after = []
    for batch in dataset:
        parts = strategy.experimental_local_results(batch)
        after.append(sorted(np.concatenate([p.numpy() for p in parts]).tolist()))
        loader.advance()
    full = [s for s in expected_steps(64) if len(s) == 64]  # drop_remainder drops 1000 % 64
    assert before + after == full


@pytest.mark.parametrize(
    ("saved_batch", "steps", "new_shards", "offset"),
    [(30, 1, 4, 30), (64, 1, 3, 64)],
    ids=["offset-30-to-4-shards", "offset-64-to-3-shards"],
)
def test_resume_offset_not_divisible_by_new_shard_count_raises(
    saved_batch, steps, new_shards, offset
):
    """A global offset the new shard count does not divide is an ElasticResumeError, no skip."""
    (loader,) = make_shards(1, saved_batch)
    global_steps([loader], steps)
    state = loader.get_state()
    assert state["offset"] == offset
    target = make_shards(new_shards, new_shards * 10)[0]
    with pytest.raises(resumeloader.ElasticResumeError, match=f"offset={offset}") as info:
        target.set_state(state)
    assert f"shard_count={new_shards}" in str(info.value)
    assert target.position == 0  # validated before anything changed

