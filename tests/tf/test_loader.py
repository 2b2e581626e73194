"""ResumableLoader through its public API: sources, map_fn, datasets, position, state, errors."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading

import _limits
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import ResumableLoader


def _ids(batches) -> list[list[int]]:
    return [np.asarray(b).tolist() for b in batches]


def _flat(batches) -> list[int]:
    return [i for batch in _ids(batches) for i in batch]


def _order(num_records: int, seed: int, epoch: int = 0) -> list[int]:
    sampler = resumeloader.IndexSampler(num_records, seed=seed)
    return sampler.epoch_indices(epoch, 0, num_records).tolist()


class _CountingArray(np.ndarray):
    """A NumPy array that counts how it is indexed (scalar vs array indices)."""

    calls: list[str]

    def __array_finalize__(self, obj):
        # Views share the log (the source keeps a read-only view of the array).
        if obj is not None and hasattr(obj, "calls"):
            self.calls = obj.calls

    def __getitem__(self, index):
        kind = "array" if isinstance(index, np.ndarray) else "scalar"
        self.calls.append(kind)
        return np.asarray(super().__getitem__(index))


class _ListSource:
    """A plain random-access source: len() and __getitem__(int), nothing else."""

    def __init__(self, records):
        self.records = records
        self.reads: list[int] = []

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        self.reads.append(index)
        return self.records[index]


# -- sources ---------------------------------------------------------------------------


def test_loader_numpy_source_unshuffled_yields_records_in_order():
    """An unshuffled array source yields its rows in order, batch by batch."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, shuffle=False, num_epochs=1)

    assert _ids(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_loader_numpy_source_shuffled_follows_the_sampler_order():
    """A shuffled epoch is the sampler's permutation, cut into batches."""
    loader = ResumableLoader(np.arange(30), batch_size=8, seed=5, num_epochs=1)

    assert _flat(loader) == _order(30, 5)


def test_loader_dict_of_arrays_source_yields_dict_batches():
    """A dict of equal-length columns yields dict batches with each column indexed alike."""
    source = {"x": np.arange(12, dtype=np.float32).reshape(6, 2), "y": np.arange(6) * 10}
    loader = ResumableLoader(source, batch_size=4, seed=1, num_epochs=1)

    batches = list(loader)

    assert [b["x"].shape.as_list() for b in batches] == [[4, 2], [2, 2]]
    for batch in batches:
        assert batch["y"].numpy().tolist() == (batch["x"].numpy()[:, 0] * 5).astype(int).tolist()


def test_loader_tuple_of_arrays_source_yields_tuple_batches():
    """A tuple of equal-length columns yields (features, labels) tuples."""
    images = np.arange(5 * 3, dtype=np.uint8).reshape(5, 3)
    labels = np.arange(5, dtype=np.int64)
    loader = ResumableLoader((images, labels), batch_size=5, seed=0, shuffle=False, num_epochs=1)

    ((batch_images, batch_labels),) = list(loader)

    assert batch_images.dtype == tf.uint8
    assert batch_images.numpy().tolist() == images.tolist()
    assert batch_labels.numpy().tolist() == labels.tolist()


def test_loader_array_source_reads_each_batch_with_one_fancy_index():
    """An array source is read with index arrays, at most once per batch (the eager loop
    reads a chunk of batches at once), never record by record."""
    source = np.arange(20).view(_CountingArray)
    source.calls = []
    loader = ResumableLoader(source, batch_size=8, seed=3, num_epochs=1, prefetch=None)
    source.calls.clear()  # construction reads record 0 for the element spec

    batches = _ids(loader)

    assert set(source.calls) == {"array"}
    assert 1 <= len(source.calls) <= 3
    assert sorted(i for batch in batches for i in batch) == list(range(20))


def test_loader_random_access_source_reads_records_by_integer_index():
    """Any object with len() and __getitem__(int) works as a source."""
    source = _ListSource([np.array([i, -i]) for i in range(7)])
    loader = ResumableLoader(source, batch_size=3, seed=2, num_epochs=1)

    batches = _ids(loader)

    assert [row for batch in batches for row in batch] == [[i, -i] for i in _order(7, 2)]
    assert all(isinstance(i, int) for i in source.reads)


# -- map_fn ----------------------------------------------------------------------------


def _noise(record, rng):
    return np.int64(record * 1000 + rng.integers(1000))


def test_loader_map_fn_rng_is_keyed_by_seed_epoch_and_record_index():
    """map_fn's rng is record_rng(seed, epoch, record index), whatever the batch layout."""
    loader = ResumableLoader(
        np.arange(9), batch_size=4, seed=11, num_epochs=2, map_fn=_noise, with_metadata=True
    )

    for data, meta in loader:
        for value, index, epoch in zip(
            data.numpy(), meta["index"].numpy(), meta["epoch"].numpy(), strict=True
        ):
            rng = resumeloader.record_rng(11, int(epoch), int(index))
            assert value == index * 1000 + rng.integers(1000)


def test_loader_map_fn_augmentation_identical_after_resume_into_fresh_loader():
    """Augmented values after a restore equal those of the uninterrupted run."""

    def build(batch_size: int) -> ResumableLoader:
        return ResumableLoader(
            np.arange(13), batch_size=batch_size, seed=4, num_epochs=2, map_fn=_noise
        )

    uninterrupted = _flat(build(3))
    first = build(3)
    head = _flat(itertools.islice(first, 5))
    resumed = build(5)  # another batch size: the same records, the same augmentation
    resumed.set_state(first.get_state())

    assert head + _flat(resumed) == uninterrupted


def test_loader_map_fn_receives_numpy_record_and_generator():
    """map_fn gets the source's NumPy record and a numpy Generator, not tensors."""
    seen = []

    def inspect(record, rng):
        seen.append((type(record), type(rng)))
        return record

    list(ResumableLoader(np.arange(4), batch_size=2, seed=0, num_epochs=1, map_fn=inspect))

    assert set(seen) == {(np.int64, np.random.Generator)}


# -- dataset() and the element spec ----------------------------------------------------


def test_dataset_starts_at_current_position_each_time_it_is_iterated():
    """One dataset object, iterated twice, starts each time at the then-current position."""
    loader = ResumableLoader(np.arange(10), batch_size=3, seed=0, shuffle=False, num_epochs=1)
    ds = loader.dataset()

    first = _ids(itertools.islice(ds, 2))
    loader.advance(2)
    second = _ids(ds)

    assert first == [[0, 1, 2], [3, 4, 5]]
    assert second == [[6, 7, 8], [9]]


def test_dataset_iteration_does_not_advance_position():
    """Iterating loader.dataset() leaves the position where it was."""
    loader = ResumableLoader(np.arange(10), batch_size=3, seed=0, num_epochs=1)

    list(loader.dataset())

    assert loader.position == 0


def test_element_spec_inferred_from_one_record():
    """Without output_signature the spec comes from record 0 after map_fn."""

    def to_dict(record, rng):
        return {"x": np.full(3, record, np.float32), "y": record}

    loader = ResumableLoader(np.arange(5), batch_size=2, seed=0, map_fn=to_dict)

    assert loader.element_spec == {
        "x": tf.TensorSpec((None, 3), tf.float32),
        "y": tf.TensorSpec((None,), tf.int64),
    }
    assert loader.dataset().element_spec == loader.element_spec


def test_element_spec_from_output_signature_skips_reading_a_record():
    """A given output_signature is used as is and no record is read at construction."""
    source = _ListSource([np.zeros(2, np.float32)] * 6)
    signature = tf.TensorSpec((2,), tf.float32)

    loader = ResumableLoader(
        source, batch_size=4, seed=0, drop_remainder=True, output_signature=signature
    )

    assert source.reads == []
    assert loader.element_spec == tf.TensorSpec((4, 2), tf.float32)
    assert next(iter(loader)).shape == (4, 2)


def test_element_spec_with_metadata_adds_index_epoch_position_seed():
    """with_metadata=True yields (data, metadata) with per-record int64 fields."""
    loader = ResumableLoader(np.arange(5), batch_size=2, seed=0, with_metadata=True)

    _, meta = loader.element_spec

    assert sorted(meta) == ["epoch", "index", "position", "seed"]
    assert meta["seed"] == tf.TensorSpec((None, 2), tf.int64)


# -- consuming and advancing -----------------------------------------------------------


def test_iter_advances_position_as_each_batch_is_handed_out():
    """`for batch in loader` advances by one batch before the body sees the batch."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=1)

    positions = [loader.position for _ in loader]

    assert positions == [4, 8, 10]


def test_iter_stopped_early_resumes_at_next_batch():
    """Breaking out of the loop and iterating again continues with the next batch."""
    loader = ResumableLoader(np.arange(10), batch_size=3, seed=0, shuffle=False, num_epochs=1)

    head = _ids(itertools.islice(loader, 2))
    rest = _ids(loader)

    assert head + rest == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("prefetch", [None, 1, tf.data.AUTOTUNE, "auto"],
                         ids=["none", "1", "autotune", "auto"])
def test_iter_stream_equals_dataset_stream(prefetch):
    """`for batch in loader` (eager prefetch thread) yields exactly dataset()'s batches."""

    def build():
        return ResumableLoader(
            np.arange(23),
            batch_size=4,
            seed=12,
            num_epochs=2,
            map_fn=_noise,
            prefetch=prefetch,
            with_metadata=True,
        )

    via_iter = [(d.numpy().tolist(), m["position"].numpy().tolist()) for d, m in build()]
    via_dataset = [
        (d.numpy().tolist(), m["position"].numpy().tolist()) for d, m in build().dataset()
    ]

    assert via_iter == via_dataset


@pytest.mark.parametrize("prefetch", [None, tf.data.AUTOTUNE], ids=["none", "auto"])
def test_iter_stopped_early_leaves_no_prefetch_thread(prefetch):
    """Breaking out of `for batch in loader` stops its prefetch thread before returning."""
    loader = ResumableLoader(np.arange(100), batch_size=2, seed=0, prefetch=prefetch)

    for _ in itertools.islice(loader, 3):
        pass

    names = [t.name for t in threading.enumerate()]
    assert "resumeloader-prefetch" not in names
    assert loader.position == 6


def test_dataset_with_advance_in_tf_function_consumes_every_batch():
    """A tf.function training loop over dataset() that calls advance() ends exhausted."""
    loader = ResumableLoader(np.arange(23), batch_size=4, seed=9, num_epochs=2)

    @tf.function
    def train(dataset):
        total = tf.constant(0, tf.int64)
        steps = tf.constant(0, tf.int64)
        for batch in dataset:
            total += tf.reduce_sum(tf.cast(batch, tf.int64))
            steps += 1
            loader.advance()
        return total, steps

    total, steps = train(loader.dataset())

    assert (int(total), int(steps)) == (2 * sum(range(23)), 2 * 6)
    assert loader.exhausted


@pytest.mark.parametrize("drop_remainder", [False, True], ids=["keep", "drop"])
@pytest.mark.parametrize("num_batches", [1, 3, 7, 20], ids=lambda n: f"{n}batches")
def test_advance_in_tf_function_matches_eager(drop_remainder, num_batches):
    """advance(n) inside a tf.function lands where the eager advance(n) does; past the end
    of the loader both refuse it, the position unchanged."""
    eager, graph = (
        ResumableLoader(
            np.arange(11), batch_size=4, seed=0, num_epochs=3, drop_remainder=drop_remainder
        )
        for _ in range(2)
    )
    eager.advance(1)
    graph.advance(1)

    if num_batches > len(eager):
        with pytest.raises(resumeloader.StreamIntegrityError, match="past the end"):
            eager.advance(num_batches)
        with pytest.raises(tf.errors.InvalidArgumentError, match="past the end"):
            tf.function(lambda: graph.advance(num_batches))()
    else:
        eager.advance(num_batches)
        tf.function(lambda: graph.advance(num_batches))()

    assert graph.position == eager.position


@pytest.mark.parametrize(
    ("consumed", "position", "epoch", "step"),
    [(0, 0, 0, 0), (2, 8, 0, 2), (3, 10, 1, 0), (4, 14, 1, 1), (6, 20, 2, 0)],
    ids=["start", "mid-epoch", "epoch-boundary", "second-epoch", "exhausted"],
)
def test_position_epoch_step_after_consumed_batches(consumed, position, epoch, step):
    """position counts records, epoch the next batch's epoch, step the batches of this epoch."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=2)

    list(itertools.islice(loader, consumed))

    assert (loader.position, loader.epoch, loader.step) == (position, epoch, step)
    assert loader.exhausted == (consumed == 6)


@pytest.mark.parametrize(
    ("drop_remainder", "sizes"),
    [(False, [4, 4, 2] * 2), (True, [4, 4] * 2)],
    ids=["partial-last-batch", "drop-remainder"],
)
def test_batches_last_of_epoch_partial_unless_drop_remainder(drop_remainder, sizes):
    """An epoch's short last batch is kept, or dropped with drop_remainder."""
    loader = ResumableLoader(
        np.arange(10), batch_size=4, seed=0, num_epochs=2, drop_remainder=drop_remainder
    )

    assert [len(b) for b in loader] == sizes
    assert loader.batches_per_epoch == len(sizes) // 2


def test_batches_never_mix_two_epochs():
    """Every record of a batch belongs to the same epoch, and each epoch is complete."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=6, num_epochs=3, with_metadata=True)

    batches = [(data.numpy(), meta["epoch"].numpy()) for data, meta in loader]

    assert all(len(set(epochs)) == 1 for _, epochs in batches)
    for epoch in range(3):
        ids = [i for data, epochs in batches if epochs[0] == epoch for i in data]
        assert ids == _order(10, 6, epoch)


def test_iter_after_exhaustion_yields_nothing():
    """An exhausted finite loader yields no further batch."""
    loader = ResumableLoader(np.arange(5), batch_size=2, seed=0, num_epochs=1)
    list(loader)

    assert list(loader) == []
    assert loader.exhausted


# -- tf.train.Checkpoint and CheckpointManager ---------------------------------------


def _model_and_optimizer():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)
    return model, optimizer


def _train_step(model, optimizer, batch):
    x = tf.cast(tf.stack([batch, batch], axis=1), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - 1.0))
    optimizer.apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True)
    )


@pytest.mark.usefixtures("clean_keras")
def test_checkpoint_with_model_and_optimizer_restores_all_together(tmp_path):
    """One tf.train.Checkpoint holds model, optimizer and loader; restore sets all three."""
    model, optimizer = _model_and_optimizer()
    loader = ResumableLoader(np.arange(20), batch_size=4, seed=3, num_epochs=1)
    for batch in itertools.islice(loader, 2):
        _train_step(model, optimizer, batch)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer, loader=loader).write(
        str(tmp_path / "ckpt")
    )
    weights = [w.numpy() for w in model.weights]

    model2, optimizer2 = _model_and_optimizer()
    _train_step(model2, optimizer2, tf.zeros(1, tf.int64))  # build the optimizer's slots
    loader2 = ResumableLoader(np.arange(20), batch_size=4, seed=3, num_epochs=1)
    checkpoint = tf.train.Checkpoint(model=model2, optimizer=optimizer2, loader=loader2)
    checkpoint.read(path).assert_existing_objects_matched()

    assert all(np.array_equal(a, b.numpy()) for a, b in zip(weights, model2.weights, strict=True))
    assert int(optimizer2.iterations.numpy()) == 2
    assert loader2.position == 8
    assert _flat(loader2) == _order(20, 3)[8:]


def test_checkpoint_manager_interval_restores_last_saved_step(tmp_path):
    """CheckpointManager(checkpoint_interval, step_counter) + restore_or_initialize resumes."""

    def job():
        loader = ResumableLoader(np.arange(30), batch_size=2, seed=8, num_epochs=1)
        step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(loader=loader, step=step)
        manager = tf.train.CheckpointManager(
            checkpoint, tmp_path, max_to_keep=2, step_counter=step, checkpoint_interval=4
        )
        return loader, step, manager

    loader, step, manager = job()
    assert manager.restore_or_initialize() is None
    for _ in itertools.islice(loader, 10):
        step.assign_add(1)
        manager.save(check_interval=True)

    resumed, resumed_step, resumed_manager = job()
    restored = resumed_manager.restore_or_initialize()

    assert restored == manager.latest_checkpoint
    # Saved at steps 1, 5 and 9 (the first call saves, then every 4 steps).
    assert int(resumed_step.numpy()) == 9
    assert resumed.position == 18
    assert _flat(resumed) == _order(30, 8)[18:]


_NEW_PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import resumeloader
    loader = resumeloader.ResumableLoader(
        np.arange(40), batch_size=6, seed=21, num_epochs=2,
        map_fn=lambda r, rng: np.int64(r * 1000 + rng.integers(1000)),
    )
    tf.train.Checkpoint(loader=loader).read(sys.argv[1]).assert_consumed()
    print(json.dumps([int(v) for b in loader for v in b.numpy()]))
    """
)


@pytest.mark.slow
def test_checkpoint_restored_in_new_process_continues_stream(tmp_path):
    """A checkpoint written here, restored in a new Python process, continues exactly."""

    def build():
        return ResumableLoader(
            np.arange(40),
            batch_size=6,
            seed=21,
            num_epochs=2,
            map_fn=lambda r, rng: np.int64(r * 1000 + rng.integers(1000)),
        )

    uninterrupted = _flat(build())
    loader = build()
    head = _flat(itertools.islice(loader, 9))  # into the second epoch
    path = tf.train.Checkpoint(loader=loader).write(str(tmp_path / "ckpt"))

    result = subprocess.run(
        [sys.executable, "-c", _NEW_PROCESS_SCRIPT, path],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=_limits.PROCESS,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert head + json.loads(result.stdout.strip().splitlines()[-1]) == uninterrupted


# -- get_state / set_state ---------------------------------------------------------------


def test_get_state_is_flat_json_serialisable_and_under_1kb():
    """The state is a flat dict of ints and strs whose JSON text is < 1 KB."""
    loader = ResumableLoader(np.arange(10**6), batch_size=128, seed=2**64 - 1)
    loader.advance(12345)

    state = loader.get_state()
    text = json.dumps(state)

    assert all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in state.values())
    assert len(text) < 1024
    assert json.loads(text) == state


@pytest.mark.parametrize("as_json", [False, True], ids=["dict", "json-text"])
def test_set_state_of_get_state_restores_position(as_json):
    """set_state(get_state()) on a fresh loader restores the exact position."""
    loader = ResumableLoader(np.arange(50), batch_size=7, seed=1)
    loader.advance(9)
    state = loader.get_state()
    fresh = ResumableLoader(np.arange(50), batch_size=7, seed=1)

    fresh.set_state(json.dumps(state) if as_json else state)

    assert (fresh.position, fresh.epoch, fresh.step) == (loader.position, 1, 1)
    assert fresh.get_state() == state


_MISMATCHES = {
    "num_records": dict(num_records=21),
    "seed": dict(seed=4),
    "shuffle": dict(shuffle=False),
    "all": dict(num_records=21, seed=4, shuffle=False),
}


def _loader(num_records=20, seed=3, shuffle=True, **kwargs):
    return ResumableLoader(
        np.arange(num_records), batch_size=4, seed=seed, shuffle=shuffle, **kwargs
    )


@pytest.mark.parametrize("changes", _MISMATCHES.values(), ids=_MISMATCHES.keys())
def test_set_state_order_mismatch_names_each_field_and_changes_nothing(changes):
    """Another num_records/seed/shuffle raises StateMismatchError naming each; position kept."""
    other = _loader(**changes)
    other.advance(2)

    with pytest.raises(resumeloader.StateMismatchError) as info:
        other.set_state(_loader().get_state())

    for field in changes:
        assert f"{field}: checkpoint has" in str(info.value)
    assert other.position == 8
    assert isinstance(info.value, ValueError)


def test_checkpoint_restore_order_mismatch_raises_and_keeps_position(tmp_path):
    """Through tf.train.Checkpoint.restore a mismatching state raises and changes nothing."""
    path = tf.train.Checkpoint(loader=_loader()).write(str(tmp_path / "ckpt"))
    other = _loader(seed=99)
    other.advance(3)

    with pytest.raises(resumeloader.StateMismatchError) as info:
        tf.train.Checkpoint(loader=other).restore(path)

    assert "seed: checkpoint has 3, this loader has 99" in str(info.value)
    assert other.position == 12


@pytest.mark.parametrize("new_batch_size", [1, 3, 8], ids=lambda b: f"bs{b}")
def test_set_state_other_batch_size_resumes_at_same_global_record(new_batch_size):
    """A state saved with batch size 4 resumes at the same record with another batch size."""
    saved = ResumableLoader(np.arange(30), batch_size=4, seed=7, num_epochs=1)
    saved.advance(3)
    resumed = ResumableLoader(np.arange(30), batch_size=new_batch_size, seed=7, num_epochs=1)

    resumed.set_state(saved.get_state())

    assert _flat(resumed) == _order(30, 7)[12:]


@pytest.mark.parametrize("shard_count", [2, 3, 4], ids=lambda s: f"{s}shards")
def test_set_state_other_shard_count_resumes_at_same_global_record(shard_count):
    """A single-shard state resumes on S shards that together continue the global order."""
    saved = ResumableLoader(np.arange(60), batch_size=6, seed=7, num_epochs=1)
    saved.advance(2)  # 12 records, divisible by 2, 3 and 4
    shards = [
        ResumableLoader(
            np.arange(60),
            batch_size=2,
            seed=7,
            num_epochs=1,
            shard=resumeloader.Shard(s, shard_count),
        )
        for s in range(shard_count)
    ]
    for shard in shards:
        shard.set_state(saved.get_state())

    firsts = [int(next(iter(shard))[0]) for shard in shards]

    assert firsts == _order(60, 7)[12 : 12 + shard_count]


def test_set_state_offset_not_divisible_by_shard_count_raises_elastic_error():
    """A global offset the new shard count cannot split exactly is refused, unchanged."""
    saved = ResumableLoader(np.arange(60), batch_size=5, seed=7)
    saved.advance(1)
    shard = ResumableLoader(np.arange(60), batch_size=2, seed=7, shard=resumeloader.Shard(0, 2))

    with pytest.raises(resumeloader.ElasticResumeError) as info:
        shard.set_state(saved.get_state())

    assert "offset=5" in str(info.value)
    assert shard.position == 0


# -- errors from user code -------------------------------------------------------------


class _Boom(Exception):
    pass


def _failing_map(record, rng):
    if record == 7:
        raise _Boom("bad record")
    return record


class _FailingSource(_ListSource):
    def __getitem__(self, index):
        if index == 7:
            raise _Boom("bad record")
        return super().__getitem__(index)


def _failing_loader(where: str, **kwargs) -> ResumableLoader:
    if where == "map_fn":
        return ResumableLoader(
            np.arange(12), batch_size=4, seed=0, num_epochs=2, map_fn=_failing_map, **kwargs
        )
    return ResumableLoader(
        _FailingSource(list(range(12))), batch_size=4, seed=0, num_epochs=2, **kwargs
    )


def _epoch_of_7() -> tuple[int, int]:
    """(epoch, position) at which record 7 is first produced by the failing loaders."""
    position = _order(12, 0).index(7)
    return 0, position


@pytest.mark.parametrize("prefetch", [None, tf.data.AUTOTUNE], ids=["no-prefetch", "prefetch"])
@pytest.mark.parametrize("where", ["map_fn", "source"])
def test_iter_user_error_raises_record_error_with_epoch_and_index(where, prefetch):
    """A raising map_fn or source surfaces as RecordError naming record and epoch, chained."""
    loader = _failing_loader(where, prefetch=prefetch)
    epoch, position = _epoch_of_7()

    with pytest.raises(resumeloader.RecordError) as info:
        list(loader)

    assert (info.value.record_index, info.value.epoch, info.value.position) == (7, epoch, position)
    assert f"record index 7 (epoch {epoch}, position {position})" in str(info.value)
    assert isinstance(info.value.__cause__, _Boom)
    assert loader.position == position // 4 * 4


@pytest.mark.parametrize("where", ["map_fn", "source"])
def test_dataset_user_error_raises_tf_error_with_record_message(where):
    """Iterating loader.dataset() directly raises a TF error carrying the same message."""
    loader = _failing_loader(where)

    with pytest.raises(tf.errors.OpError) as info:
        list(loader.dataset())

    assert "record index 7 (epoch 0" in str(info.value)
    assert "bad record" in str(info.value)


@pytest.mark.parametrize("where", ["map_fn", "source"])
def test_dataset_user_error_through_parallel_map_and_prefetch_surfaces(where):
    """Downstream map(num_parallel_calls=AUTOTUNE) + prefetch: the error surfaces, no hang."""
    loader = _failing_loader(where, prefetch=2)
    ds = loader.dataset().map(lambda b: b * 2, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)

    with pytest.raises(tf.errors.OpError) as info:
        for _ in ds:
            loader.advance()

    assert "record index 7 (epoch 0" in str(info.value)


_BAD_RECORDS = {
    "structure": lambda r: {"x": r},
    "dtype": lambda r: np.float32(r),
    "shape": lambda r: np.array([r, r]),
}


@pytest.mark.parametrize("kind", _BAD_RECORDS)
def test_iter_map_fn_returning_other_spec_raises_record_spec_error(kind):
    """A record whose structure, dtype or shape differs from the spec names that record."""
    bad = _BAD_RECORDS[kind]

    def map_fn(record, rng):
        return bad(record) if record == 7 else np.int64(record)

    loader = ResumableLoader(np.arange(12), batch_size=4, seed=0, num_epochs=1, map_fn=map_fn)

    with pytest.raises(resumeloader.RecordSpecError) as info:
        list(loader)

    assert info.value.record_index == 7
    assert "Record index 7 (epoch 0" in str(info.value)
    assert "int64[]" in str(info.value)


# -- argument validation ---------------------------------------------------------------

_SOURCE = np.arange(10)
_BAD_ARGUMENTS = [
    ("batch-size-zero", dict(batch_size=0), ValueError, "batch_size"),
    ("batch-size-negative", dict(batch_size=-3), ValueError, "batch_size"),
    ("batch-size-float", dict(batch_size=2.0), TypeError, "batch_size"),
    ("batch-size-bool", dict(batch_size=True), TypeError, "batch_size"),
    ("seed-bool", dict(seed=True), TypeError, "seed"),
    ("seed-negative", dict(seed=-1), ValueError, "seed"),
    ("seed-too-big", dict(seed=2**64), ValueError, "seed"),
    ("seed-str", dict(seed="1"), TypeError, "seed"),
    ("map-fn-not-callable", dict(map_fn=3), TypeError, "map_fn"),
    ("shuffle-int", dict(shuffle=1), TypeError, "shuffle"),
    ("num-epochs-zero", dict(num_epochs=0), ValueError, "num_epochs"),
    ("shard-not-a-shard", dict(shard=(1, 2)), TypeError, "shard"),
    ("shard-count-above-records", dict(shard=resumeloader.Shard(0, 11)), ValueError, "shard_count"),
    ("workers-not-workers", dict(workers=2), TypeError, "workers"),
    ("prefetch-negative", dict(prefetch=-5), ValueError, "prefetch"),
    ("drop-remainder-int", dict(drop_remainder=1), TypeError, "drop_remainder"),
    ("with-metadata-str", dict(with_metadata="yes"), TypeError, "with_metadata"),
    (
        "batch-larger-than-epoch-dropped",
        dict(batch_size=11, drop_remainder=True),
        ValueError,
        "batch_size",
    ),
    ("output-signature-not-spec", dict(output_signature="int64"), TypeError, "output_signature"),
    ("empty-source", dict(source=np.arange(0)), ValueError, "at least one record"),
    ("source-not-indexable", dict(source=5), TypeError, "source"),
    (
        "source-columns-unequal",
        dict(source={"a": np.arange(3), "b": np.arange(4)}),
        ValueError,
        "equal lengths",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "error", "fragment"),
    [case[1:] for case in _BAD_ARGUMENTS],
    ids=[case[0] for case in _BAD_ARGUMENTS],
)
def test_loader_invalid_argument_fails_at_construction(overrides, error, fragment):
    """Each invalid argument raises at construction with a message naming it."""
    kwargs = dict(source=_SOURCE, batch_size=4, seed=0) | overrides
    source = kwargs.pop("source")

    with pytest.raises(error) as info:
        ResumableLoader(source, **kwargs)

    assert fragment in str(info.value)
    assert "Received" in str(info.value) or "received" in str(info.value)


def test_advance_after_batch_in_tf_function_step_keeps_stream():
    """next(iterator) and advance(after=batch) in one tf.function step reproduce the stream."""
    loader = ResumableLoader(
        np.arange(23), batch_size=4, seed=5, num_epochs=2, with_metadata=True
    )
    reference = [b[1]["index"].numpy().tolist() for b in ResumableLoader(
        np.arange(23), batch_size=4, seed=5, num_epochs=2, with_metadata=True
    ).dataset()]

    @tf.function
    def step(iterator):
        batch = next(iterator)
        loader.advance(after=batch)
        return batch[1]["index"]

    seen = []
    for _ in range(3):  # a fresh iterator each round: every round races on its first step
        iterator = iter(loader.dataset())
        for _ in range(4):
            if loader.exhausted:
                break
            seen.append(step(iterator).numpy().tolist())
    assert seen == reference[: len(seen)]
    assert len(seen) == 12


@pytest.mark.parametrize("pull", ["next", "get_next_as_optional"], ids=str)
def test_advance_in_tf_function_without_after_keeps_each_iterators_first_batch(pull):
    """A tf.function that pulls a batch then advances (no after=) loses no first batch."""
    make = lambda: ResumableLoader(  # noqa: E731
        np.arange(64), batch_size=4, seed=5, num_epochs=1, with_metadata=True
    )
    reference = [m["index"].numpy().tolist() for _, m in make().dataset()]
    loader = make()

    @tf.function
    def step(iterator):
        optional = pull != "next"
        batch = iterator.get_next_as_optional().get_value() if optional else next(iterator)
        loader.advance()
        return batch[1]["index"]

    seen = []
    for _ in range(4):  # a fresh iterator each round: its first batch reads the position
        iterator = iter(loader.dataset())
        seen += [step(iterator).numpy().tolist() for _ in range(3)]

    assert seen == reference[:12]
    assert loader.position == 48


def test_advance_eager_integer_tensor_is_accepted():
    """advance(<eager integer tensor>) works eagerly as it does in a graph."""
    loader = ResumableLoader(np.arange(20), batch_size=4, seed=0, num_epochs=1)

    loader.advance(tf.constant(2))
    loader.advance(np.int64(1))

    assert loader.position == 12


def test_get_state_inside_tf_function_raises_type_error():
    """get_state() while tracing a tf.function raises a TypeError saying to call it eagerly."""
    loader = ResumableLoader(np.arange(20), batch_size=4, seed=0, num_epochs=1)

    @tf.function
    def save():
        return loader.get_state()["offset"]

    with pytest.raises(TypeError, match="runs eagerly only") as info:
        save()
    assert "get_state()" in str(info.value)


def test_checkpoint_with_variable_under_loader_key_raises_state_error(tmp_path):
    """A checkpoint whose `loader` key holds a variable is refused with a StateError."""
    path = tf.train.Checkpoint(loader=tf.Variable(3)).write(str(tmp_path / "ckpt"))
    loader = ResumableLoader(np.arange(20), batch_size=4, seed=0, num_epochs=1)

    with pytest.raises(resumeloader.StateError, match=r"saved from a tf\.Variable") as info:
        tf.train.Checkpoint(loader=loader).read(path)

    assert "dtype int32" in str(info.value)
    assert loader.position == 0


def test_iter_inside_tf_function_raises_type_error():
    """`for batch in loader` inside a tf.function names the dataset() + advance() way."""
    loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, num_epochs=1)

    @tf.function
    def count():
        return sum(1 for _ in loader)

    with pytest.raises(TypeError, match=r"loader\.dataset\(\)"):
        count()
    assert loader.position == 0


@pytest.mark.parametrize("prefetch", ["fast", "AUTO", -2, 1.5])
def test_prefetch_other_than_a_count_none_or_auto_is_refused(prefetch):
    """``prefetch`` is a count, None or 'auto'; anything else is named in the error."""
    with pytest.raises((TypeError, ValueError), match="prefetch"):
        ResumableLoader(np.arange(10), batch_size=2, seed=0, prefetch=prefetch)
