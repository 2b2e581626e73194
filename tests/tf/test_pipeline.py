"""Tests of composing stages: Pipeline, from_pipeline, state fields, states written by 0.1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import Pipeline, ResumableLoader
from resumeloader.stages import BatchStage, MapStage, SamplerStage

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0_1"
V01 = json.loads((FIXTURES / "state.json").read_text())


def _add(offset):
    def fn(record, rng):
        return record + offset

    return fn


def test_pipeline_methods_return_new_pipelines_leaving_the_original():
    """Each composing method returns a new pipeline; the original is unchanged."""
    base = Pipeline(np.arange(10), seed=0)
    shuffled = base.shuffle()
    batched = shuffled.map(_add(1)).batch(3)

    assert [s.name for s in base.stages] == ["sampler"]
    assert not base.index_stage.shuffle and shuffled.index_stage.shuffle
    assert [type(s) for s in batched.stages][1:] == [MapStage, type(batched.batch_stage)]
    assert isinstance(batched.batch_stage, BatchStage) and base.batch_stage is None


def test_from_pipeline_equals_short_form_stream():
    """from_pipeline(Pipeline...) yields the short form's stream, byte for byte."""
    data = np.arange(40, dtype=np.float32).reshape(20, 2)
    short = ResumableLoader(data, batch_size=3, seed=4, num_epochs=2, map_fn=_add(5))
    composed = ResumableLoader.from_pipeline(
        Pipeline(data, seed=4).shuffle().map(_add(5)).batch(3), num_epochs=2
    )

    assert [b.numpy().tolist() for b in short] == [b.numpy().tolist() for b in composed]
    assert short.get_state() == composed.get_state()


def test_two_record_stages_run_in_order():
    """Record stages run one after the other, in the order they were added."""
    pipeline = Pipeline(np.arange(4), seed=0).map(_add(1)).map(lambda r, g: r * 10).batch(4)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)

    assert next(iter(loader)).numpy().tolist() == [10, 20, 30, 40]


def test_state_names_each_stage_field_and_fingerprints_them():
    """get_state holds every stage's order fields as stage.field, hashed by the fingerprint."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=9)
    state = loader.get_state()

    assert state["pipeline.seed"] == 9
    assert state["sampler.shuffle"] == 1
    assert state["source.num_records"] == 10
    assert {k for k in state if "." not in k} == {
        "version", "fingerprint", "epoch", "offset", "row", "shard_count", "batch_size",
    }


def test_set_state_of_other_pipeline_names_stage_and_field():
    """A state of a pipeline with another stage configuration is refused naming stage.field."""
    saved = ResumableLoader(np.arange(10), batch_size=4, seed=9)
    unshuffled = ResumableLoader(np.arange(10), batch_size=4, seed=9, shuffle=False)
    unshuffled.advance()

    with pytest.raises(resumeloader.StateMismatchError) as info:
        unshuffled.set_state(saved.get_state())

    assert "  sampler.shuffle: checkpoint has 1, this loader has 0" in str(info.value)
    assert "stages sampler differ" in str(info.value)
    assert unshuffled.position == 4


def test_custom_index_stage_enters_the_state_under_its_name():
    """A user index stage added with apply() contributes its fields to the state."""

    class Reversed(resumeloader.stages.IndexStage):
        name = "reversed"

        @property
        def num_records(self):
            return 6

        def indices(self, epoch, offsets, *, seed):
            return 5 - offsets

        def order_fields(self):
            return {"direction": "backwards"}

    pipeline = Pipeline(np.arange(6), seed=0).apply(Reversed()).batch(4)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)

    assert [b.numpy().tolist() for b in loader] == [[5, 4, 3, 2], [1, 0]]
    assert loader.get_state()["reversed.direction"] == "backwards"


@pytest.mark.parametrize(
    ("build", "error", "fragment"),
    [
        (lambda p: p.batch(2).map(_add(1)), ValueError, "must come before the batch stage"),
        (lambda p: p.batch(2).batch(3), ValueError, "must come before the batch stage"),
        (lambda p: p.batch("2"), TypeError, "`batch_size` must be of type int"),
        (lambda p: p.batch(0), ValueError, "batch_size"),
        (lambda p: p.shuffle(1), TypeError, "`enabled` must be of type bool"),
        (lambda p: p.map(3), TypeError, "`fn` must be callable"),
        (lambda p: p.apply("stage"), TypeError, "`stage` must be an IndexStage"),
    ],
    ids=["map-after-batch", "batch-twice", "batch-size-str", "batch-size-zero",
         "shuffle-int", "map-not-callable", "apply-not-stage"],
)
def test_pipeline_bad_composition_raises_naming_argument(build, error, fragment):
    """Each wrong use of the builder raises a clear error naming what is wrong."""
    with pytest.raises(error) as info:
        build(Pipeline(np.arange(10), seed=0))
    assert fragment in str(info.value)
    assert "Received" in str(info.value)


def test_from_pipeline_without_batch_stage_raises():
    """A pipeline without a batch stage cannot be delivered."""
    with pytest.raises(ValueError, match=r"no batch stage: add `\.batch\(batch_size\)`"):
        ResumableLoader.from_pipeline(Pipeline(np.arange(10), seed=0))


def test_from_pipeline_not_a_pipeline_raises_type_error():
    """from_pipeline refuses anything but a Pipeline, naming what it got."""
    with pytest.raises(TypeError, match=r"`pipeline` must be a resumeloader\.Pipeline"):
        ResumableLoader.from_pipeline(np.arange(10))


def _v01_loader() -> ResumableLoader:
    config = V01["loader"]
    return ResumableLoader(
        np.arange(100),
        batch_size=config["batch_size"],
        seed=config["seed"],
        num_epochs=config["num_epochs"],
    )


def test_version_1_state_json_restores_same_position_and_stream():
    """A state written by 0.1 restores at its position and yields the batches 0.1 yielded."""
    loader = _v01_loader()
    loader.set_state(V01["state"])

    assert loader.position == V01["position"]
    assert [b.numpy().tolist() for b in loader][: len(V01["next_batches"])] == V01["next_batches"]
    assert loader.get_state()["version"] == 2


def test_version_1_tf_checkpoint_restores_same_position_and_stream():
    """A tf.train.Checkpoint written by 0.1 restores into the new loader, same stream."""
    loader = _v01_loader()
    tf.train.Checkpoint(loader=loader).read(str(FIXTURES / "ckpt")).assert_consumed()

    assert loader.position == V01["position"]
    assert [b.numpy().tolist() for b in loader][: len(V01["next_batches"])] == V01["next_batches"]


def test_sampler_stage_is_the_index_sampler_order():
    """The sampler stage and IndexSampler agree offset for offset (one permutation)."""
    stage = SamplerStage(1000, shuffle=True)
    sampler = resumeloader.IndexSampler(1000, seed=3)
    offsets = np.arange(1000)

    assert stage.indices(4, offsets, seed=3).tolist() == sampler.epoch_indices(4, 0, 1000).tolist()
