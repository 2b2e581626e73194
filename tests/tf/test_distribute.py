"""loader.dataset(input_context=...) under tf.distribute: each global step holds exactly the
records of the single-process batch, across checkpoints and restores into fresh loaders."""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path

import _cluster
import _mwms_worker
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import resumeloader
from resumeloader import Shard

pytestmark = pytest.mark.usefixtures("clean_keras")

NUM_RECORDS = 70
GLOBAL_BATCH = 8


def make_loader(**overrides) -> resumeloader.ResumableLoader:
    kwargs = dict(
        batch_size=GLOBAL_BATCH,
        seed=11,
        num_epochs=2,
        drop_remainder=True,
        with_metadata=True,
    )
    kwargs.update(overrides)
    return resumeloader.ResumableLoader(np.arange(NUM_RECORDS, dtype=np.int64), **kwargs)


def reference_steps(**overrides) -> list[list[int]]:
    """Sorted record indices of every batch of the single-process loader."""
    loader = make_loader(prefetch=None, **overrides)
    return [sorted(meta["index"].numpy().tolist()) for _, meta in loader]


@pytest.fixture(scope="module")
def strategy() -> tf.distribute.MirroredStrategy:
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2, "conftest must split the CPU into two logical devices"
    return tf.distribute.MirroredStrategy(devices)


def distributed_steps(strategy, loader, num_steps=None) -> list[list[int]]:
    """Runs the training-loop protocol: one step per distributed element, then advance."""
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: loader.dataset(input_context=ctx)
    )
    steps = []
    for _, meta in dataset:
        parts = strategy.experimental_local_results(meta["index"])
        steps.append(sorted(np.concatenate([p.numpy() for p in parts]).tolist()))
        loader.advance()
        if num_steps is not None and len(steps) == num_steps:
            break
    return steps


def test_dataset_mirrored_strategy_steps_equal_single_process_batches(strategy):
    """Each MirroredStrategy step over 2 replicas holds the single-process batch's records."""
    with strategy.scope():
        loader = make_loader()
    assert distributed_steps(strategy, loader) == reference_steps()
    assert loader.exhausted


def test_dataset_mirrored_strategy_replica_batches_are_per_replica_size(strategy):
    """Every replica receives batch_size / num_replicas records per step."""
    with strategy.scope():
        loader = make_loader()
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: loader.dataset(input_context=ctx)
    )
    data, _ = next(iter(dataset))
    shapes = [tuple(p.shape) for p in strategy.experimental_local_results(data)]
    assert shapes == [(GLOBAL_BATCH // 2,), (GLOBAL_BATCH // 2,)]


@pytest.mark.parametrize(
    "steps_before", [0, 3, 8, 16], ids=["start", "mid-epoch", "boundary", "end"]
)
def test_dataset_mirrored_strategy_restore_into_fresh_loader_continues_exactly(
    strategy, tmp_path, steps_before
):
    """A checkpoint restored into a fresh loader in scope continues the global stream."""
    with strategy.scope():
        loader = make_loader()
    first = distributed_steps(strategy, loader, steps_before) if steps_before else []
    path = tf.train.Checkpoint(loader=loader).write(str(tmp_path / "ckpt"))
    with strategy.scope():
        fresh = make_loader()
    tf.train.Checkpoint(loader=fresh).read(path).assert_consumed()
    assert first + distributed_steps(strategy, fresh) == reference_steps()


def test_dataset_mirrored_strategy_advance_in_replica_fn_steps_equal_single_process(strategy):
    """Advancing inside strategy.run of a tf.function step, after the batch, keeps exact steps."""
    with strategy.scope():
        loader = make_loader()
    iterator = iter(
        strategy.distribute_datasets_from_function(lambda ctx: loader.dataset(input_context=ctx))
    )

    def replica_fn(data, meta):
        # The generator reads the position when it starts: advance after the batch exists.
        loader.advance(after=meta["index"])
        return meta["index"]

    @tf.function
    def train_step():
        return strategy.run(replica_fn, args=next(iterator))

    steps = []
    while not loader.exhausted:
        parts = strategy.experimental_local_results(train_step())
        steps.append(sorted(np.concatenate([p.numpy() for p in parts]).tolist()))
    assert steps == reference_steps()


@pytest.mark.parametrize("in_scope", [True, False], ids=["created-in-scope", "created-outside"])
def test_loader_repr_inside_tf_function_does_not_raise(strategy, in_scope):
    """repr() of a loader in a traced function (TF's warnings format it) names no value."""
    if in_scope:
        with strategy.scope():
            loader = make_loader()
    else:
        loader = make_loader()
    texts = []
    tf.function(lambda: texts.append(repr(loader)))()
    assert texts[0].endswith("position=<symbolic>)")
    assert repr(loader).endswith("epoch=0, position=0)")


@pytest.mark.parametrize("in_scope", [True, False], ids=["created-in-scope", "created-outside"])
@pytest.mark.parametrize("traced", [True, False], ids=["tf-function", "eager"])
def test_advance_in_replica_context_advances_one_global_step(strategy, in_scope, traced):
    """advance() called by every replica in strategy.run moves one batch, not one per replica."""
    if in_scope:
        with strategy.scope():
            loader = make_loader()
    else:
        loader = make_loader()

    def step():
        strategy.run(loader.advance)

    (tf.function(step) if traced else step)()
    assert loader.position == GLOBAL_BATCH


@pytest.mark.parametrize(
    ("num_pipelines", "num_replicas", "shard_index", "shard_count"),
    [(2, 2, 0, 1), (2, 4, 0, 1), (4, 4, 0, 1), (2, 4, 1, 2)],
    ids=["2-pipelines-2-replicas", "2-pipelines-4-replicas", "4-pipelines", "shard-1-of-2"],
)
def test_dataset_input_pipelines_together_equal_single_process_batches(
    num_pipelines, num_replicas, shard_index, shard_count
):
    """The union over input pipelines of each step's per-replica batches is the loader's batch."""
    layout = dict(shard=Shard(shard_index, shard_count))
    loader = make_loader(prefetch=None, **layout)
    replicas_per_pipeline = num_replicas // num_pipelines
    streams = []
    for pipeline_id in range(num_pipelines):
        ctx = tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)
        elements = [meta["index"].numpy() for _, meta in loader.dataset(input_context=ctx)]
        streams.append(elements)
    steps = collections.defaultdict(list)
    for elements in streams:
        for i, element in enumerate(elements):
            assert len(element) == GLOBAL_BATCH // num_replicas
            steps[i // replicas_per_pipeline].extend(element.tolist())
    assert [sorted(steps[t]) for t in range(len(steps))] == reference_steps(**layout)


def test_dataset_input_context_batch_not_divisible_by_replicas_raises():
    """A global batch that does not split among the replicas is a ValueError naming both."""
    loader = make_loader()
    ctx = tf.distribute.InputContext(1, 0, 3)
    with pytest.raises(ValueError, match="batch_size=8") as info:
        loader.dataset(input_context=ctx)
    assert "num_replicas_in_sync=3" in str(info.value)


def test_dataset_input_context_short_last_batch_raises():
    """Without drop_remainder an epoch ending in a short global batch cannot be split."""
    loader = make_loader(drop_remainder=False)
    with pytest.raises(ValueError, match="drop_remainder=True") as info:
        loader.dataset(input_context=tf.distribute.InputContext(1, 0, 2))
    assert "records per epoch (per shard)=70" in str(info.value)


def test_dataset_input_context_full_epochs_without_drop_remainder_accepted():
    """Without drop_remainder, epochs made of full global batches are accepted."""
    loader = make_loader(drop_remainder=False, batch_size=7)
    ctx = tf.distribute.InputContext(1, 0, 1)
    steps = [sorted(m["index"].numpy().tolist()) for _, m in loader.dataset(input_context=ctx)]
    assert steps == reference_steps(drop_remainder=False, batch_size=7)


def test_dataset_input_context_wrong_type_raises():
    """Anything but a tf.distribute.InputContext is a TypeError."""
    loader = make_loader()
    with pytest.raises(TypeError, match="InputContext") as info:
        loader.dataset(input_context=2)
    assert "input_context=2" in str(info.value)


def test_dataset_input_context_position_not_divisible_by_pipelines_raises():
    """A position the pipelines cannot split evenly is an ElasticResumeError, not a skip."""
    loader = make_loader()
    loader.set_state(dict(loader.get_state(), offset=6))  # e.g. saved with batch_size=6
    with pytest.raises(resumeloader.ElasticResumeError, match="offset=6") as info:
        loader.dataset(input_context=tf.distribute.InputContext(4, 0, 4))
    assert "num_input_pipelines=4" in str(info.value)


@pytest.mark.slow
def test_dataset_multi_worker_killed_and_restarted_steps_equal_single_process(tmp_path):
    """2 MWMS worker processes, SIGKILLed mid-epoch and restarted, see the single-process steps."""
    kill_at = 9  # checkpoints after steps 3 and 7: steps 8 and 9 are run twice
    script = Path(_mwms_worker.__file__)
    killed = _cluster.run_workers(script, str(tmp_path), str(kill_at))
    for proc in killed:
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    resumed = _cluster.run_workers(script, str(tmp_path), "-1")
    for proc in resumed:
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]

    reference = make_loader_like_worker()
    want = [sorted(meta["index"].numpy().tolist()) for _, meta in reference]
    steps: dict[int, list[int]] = collections.defaultdict(list)
    first_resumed_step = []
    for index in range(2):
        lines = [json.loads(line) for line in (tmp_path / f"log-{index}.jsonl").open()]
        last_run = [line for line in lines if line["pid"] == lines[-1]["pid"]]
        first_resumed_step.append(last_run[0]["step"])
        latest = {line["step"]: line["records"] for line in lines}  # later runs overwrite
        for step, records in latest.items():
            steps[step].extend(records)
    assert first_resumed_step == [8, 8]
    assert [sorted(steps[t]) for t in range(len(steps))] == want
    for index in range(2):
        result = json.loads((tmp_path / f"result-{index}.json").read_text())
        assert result["state"] == reference.get_state()
        assert result["weight"] == -float(sum(sum(batch) for batch in want))


def make_loader_like_worker() -> resumeloader.ResumableLoader:
    loader = _mwms_worker.make_loader()
    assert loader.position == 0
    return loader


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_dataset_input_pipelines_any_layout_continue_single_process_batches(data):
    """For any pipelines/replicas/shards layout and start, each step is the single-process batch."""
    num_pipelines = data.draw(st.integers(1, 3), label="num_pipelines")
    num_replicas = num_pipelines * data.draw(st.integers(1, 2), label="replicas_per_pipeline")
    batch_size = num_replicas * data.draw(st.integers(1, 3), label="per_replica_batch")
    shard_count = data.draw(st.integers(1, 2), label="shard_count")
    shard_index = data.draw(st.integers(0, shard_count - 1), label="shard_index")
    num_records = data.draw(st.integers(shard_count * batch_size, 40), label="num_records")
    options = dict(
        batch_size=batch_size,
        seed=data.draw(st.integers(0, 2**64 - 1), label="seed"),
        num_epochs=2,
        drop_remainder=True,
        shard=resumeloader.Shard(shard_index, shard_count),
        prefetch=None,
        with_metadata=True,
    )
    loader = resumeloader.ResumableLoader(np.arange(num_records), **options)
    loader.advance(data.draw(st.integers(0, 2 * loader.batches_per_epoch), label="start"))
    reference = resumeloader.ResumableLoader(np.arange(num_records), **options)
    reference.set_state(loader.get_state())
    want = [sorted(meta["index"].numpy().tolist()) for _, meta in reference]
    steps = collections.defaultdict(list)
    for pipeline_id in range(num_pipelines):
        ctx = tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)
        for i, (_, meta) in enumerate(loader.dataset(input_context=ctx)):
            steps[i // (num_replicas // num_pipelines)].extend(meta["index"].numpy().tolist())
    assert [sorted(steps[t]) for t in range(len(steps))] == want
