"""One seed authority: the pipeline's seed is the only one; stages receive it per call,
the state records it, and `Plan.sampler` is the order the plan streams. No TensorFlow."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from resumeloader import Pipeline, Shard
from resumeloader.stages import (
    BlockStage,
    IndexStage,
    MapBatchStage,
    MapStage,
    MixStage,
    RecordStage,
    SamplerStage,
)
from resumeloader.stages.plan import Plan


def _identity(value, _rng):
    return value


@pytest.mark.parametrize(
    "make",
    [
        lambda: SamplerStage(10, seed=5, shuffle=True),
        lambda: BlockStage(10, seed=5, chunk_records=2, window_chunks=2),
        lambda: MixStage(["a"], [3], [Fraction(1)], seed=5, shuffle=True),
        lambda: MapStage(_identity, seed=5),
        lambda: MapBatchStage(_identity, seed=5),
    ],
    ids=["sampler", "blocks", "mix", "map", "map_batch"],
)
def test_stage_given_a_seed_is_refused_naming_the_pipeline_seed(make):
    """A stage made with a seed of its own is refused: the pipeline's is the only one."""
    with pytest.raises(TypeError, match="A stage holds no seed") as info:
        make()
    assert "seed=5" in str(info.value)
    assert "Pipeline(source, seed=...)" in str(info.value)


def test_apply_refuses_a_stage_that_holds_a_seed_attribute():
    """A stage of your own that keeps a seed (as 0.3's stages did) is refused by apply."""

    class Seeded(RecordStage):
        name = "seeded"

        def __init__(self) -> None:
            self.seed = 6

        def apply(self, record, *, seed, epoch, index):
            return record

    with pytest.raises(TypeError, match=r"A stage holds no seed.*Seeded\(\.\.\., seed=6\)"):
        Pipeline(np.arange(10), seed=0).apply(Seeded())


def test_pipelines_of_two_seeds_differ_in_order_fields_and_stream():
    """The two pipelines of the bug report now differ where a checkpoint compares them."""
    plans = [
        Plan(Pipeline(np.arange(10), seed=seed).apply(SamplerStage(10, shuffle=True)).batch(5),
             num_epochs=1)
        for seed in (5, 6)
    ]
    fields = [plan.order_fields() for plan in plans]
    assert {k for k in fields[0] if fields[0][k] != fields[1][k]} == {"pipeline.seed"}
    assert plans[0].indices(0, 0, 10).tolist() != plans[1].indices(0, 0, 10).tolist()


@pytest.mark.parametrize("kind", ["sampler", "blocks", "mix", "custom"])
def test_index_stage_receives_the_pipeline_seed(kind):
    """Every index stage's order follows the pipeline's seed, and only it."""
    seen: list[int] = []

    class Recording(IndexStage):
        name = "recording"
        num_records = 12

        def indices(self, epoch, offsets, *, seed):
            seen.append(seed)
            return (offsets + seed) % self.num_records

    def order(seed: int) -> list[int]:
        if kind == "mix":
            pipeline = Pipeline.mix({"a": np.arange(7), "b": np.arange(5)},
                                    weights={"a": 1, "b": 1}, seed=seed)
        else:
            pipeline = Pipeline(np.arange(12), seed=seed)
            if kind == "sampler":
                pipeline = pipeline.shuffle()
            elif kind == "blocks":
                pipeline = pipeline.shuffle(chunk_records=3, window_chunks=2)
            else:
                pipeline = pipeline.apply(Recording())
        plan = Plan(pipeline.batch(4), num_epochs=2)
        return plan.indices(1, 0, plan.records_per_epoch).tolist()

    assert order(11) == order(11)
    assert order(11) != order(12)
    if kind == "custom":
        assert set(seen) == {11, 12}


@pytest.mark.parametrize(
    ("seed", "shuffle", "shard"),
    [(0, True, Shard(0, 1)), (7, True, Shard(1, 3)), (2**64 - 1, True, Shard(2, 4)),
     (3, False, Shard(1, 2))],
    ids=["seed-0", "seed-7-shard-1-of-3", "seed-max-shard-2-of-4", "unshuffled"],
)
def test_plan_sampler_is_the_order_the_plan_streams(seed, shuffle, shard):
    """`Plan.sampler` (what `loader.sampler` returns) gives the plan's indices, position
    by position, across epochs."""
    pipeline = Pipeline(np.arange(23), seed=seed).shuffle(shuffle).batch(4)
    plan = Plan(pipeline, num_epochs=3, shard=shard)
    sampler = plan.sampler
    streamed = np.concatenate([task.indices for task in plan.tasks(0)])
    assert sampler.seed == seed
    assert sampler.indices(0, len(sampler)).tolist() == streamed.tolist()


def test_block_stage_order_is_keyed_by_the_seed_it_receives():
    """The same block stage in two pipelines follows each pipeline's seed."""
    stage = BlockStage(40, chunk_records=4, window_chunks=2)
    offsets = np.arange(40)
    first, again = stage.indices(2, offsets, seed=1), stage.indices(2, offsets, seed=1)
    assert first.tolist() == again.tolist()
    assert first.tolist() != stage.indices(2, offsets, seed=2).tolist()
    assert sorted(first.tolist()) == list(range(40))
