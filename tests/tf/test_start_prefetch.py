"""``loader.start_prefetch()``: the next loop's batches made while the model restores.

Each test compares the stream a loop hands out after `start_prefetch` with the stream a
fresh loader hands out from the same position without it (the same records, the same
keyed augmentation), and counts the records made before the loop asked for its first
batch: the map function leaves a file per record it makes (`_worker_fns.Marked`),
counted across worker threads and processes.
"""

from __future__ import annotations

import os
import time

import _worker_fns as fns
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import Pipeline, ResumableLoader, Workers

BATCH = 8


def _pipeline(marks=None) -> Pipeline:
    fn = fns.augment if marks is None else fns.Marked(str(marks))
    data = np.arange(400, dtype=np.float32).reshape(200, 2)
    return Pipeline(data, seed=5).shuffle().map(fn).batch(BATCH)


def _loader(marks=None, **options) -> ResumableLoader:
    return ResumableLoader.from_pipeline(_pipeline(marks), num_epochs=2, **options)


def _state_at(step: int) -> dict:
    loader = _loader(prefetch=0)
    loader.advance(step)
    return loader.get_state()


def _stream(loader: ResumableLoader) -> list[np.ndarray]:
    return [batch.numpy() for batch in loader]


def _from(state: dict) -> list[np.ndarray]:
    """The batches a fresh loader hands out from `state`, without start_prefetch."""
    loader = _loader(prefetch=0)
    loader.set_state(state)
    return _stream(loader)


def _made(marks) -> int:
    return len(os.listdir(marks))


def _wait_for(marks, count: int) -> int:
    """Waits until `count` records were made (a guard against a hang, not a timing)."""
    deadline = time.monotonic() + 120
    while _made(marks) < count:
        assert time.monotonic() < deadline, f"only {_made(marks)} of {count} records made"
        time.sleep(0.01)
    return _made(marks)


def _assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "options",
    [{}, {"prefetch": 0}, {"workers": Workers(2, kind="thread")},
     {"workers": Workers(2, kind="process")}],
    ids=["calling-thread", "no-prefetch", "threads", "processes"],
)
def test_start_prefetch_makes_the_first_batch_before_the_loop_asks(tmp_path, options):
    """After start_prefetch, the first batch's records are made before the first next();
    the loop then hands out exactly the stream of a loader that never started early."""
    state = _state_at(7)
    loader = _loader(tmp_path, **options)
    loader.set_state(state)
    before = _made(tmp_path)  # the record probed when the loader was built
    loader.start_prefetch()
    made = _wait_for(tmp_path, before + BATCH) - before
    assert made >= BATCH
    with loader:
        _assert_same(_stream(loader), _from(state))
    assert loader.exhausted


def test_a_move_after_start_prefetch_drops_what_it_made(tmp_path):
    """set_state or advance to another position after start_prefetch: the loop hands out
    that position's stream, not the one started."""
    loader = _loader(tmp_path)
    loader.set_state(_state_at(3))
    loader.start_prefetch()
    _wait_for(tmp_path, BATCH)
    loader.set_state(_state_at(20))
    _assert_same(_stream(loader), _from(_state_at(20)))

    loader.set_state(_state_at(3))
    loader.start_prefetch()
    loader.advance(2)
    _assert_same(_stream(loader), _from(_state_at(5)))


def test_start_prefetch_twice_and_set_state_to_the_same_position_keep_the_batches(tmp_path):
    """Starting again, or restoring the same state again (a checkpoint restore after the
    loader's own), keeps what was started; the stream is unchanged."""
    state = _state_at(11)
    loader = _loader(tmp_path, prefetch=0)
    loader.set_state(state)
    loader.start_prefetch()
    made = _wait_for(tmp_path, BATCH + 1)
    loader.start_prefetch()
    loader.set_state(state)
    loader.start_prefetch()
    time.sleep(0.2)  # what a restart would make meanwhile (none: prefetch=0 stops at one)
    assert _made(tmp_path) == made
    _assert_same(_stream(loader), _from(state))


def test_restore_with_start_prefetch_restores_model_and_loader(tmp_path):
    """restore(manager, loader, start_prefetch=True): the loader's batches start before
    the model is restored; both are restored; the stream is the saved position's."""
    weights = tf.Variable([0.0, 0.0])
    loader = _loader(prefetch=0)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=weights, loader=loader), str(tmp_path / "ckpt"), 2
    )
    for step, _ in enumerate(loader):
        weights.assign_add([1.0, 2.0])
        if step == 5:
            manager.save()
            state = loader.get_state()
            break
    marks = tmp_path / "marks"
    marks.mkdir()
    fresh_weights, fresh = tf.Variable([0.0, 0.0]), _loader(marks)
    before = _made(marks)
    fresh_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=fresh_weights, loader=fresh), str(tmp_path / "ckpt"), 2
    )
    assert resumeloader.restore(fresh_manager, fresh, start_prefetch=True) is not None
    _wait_for(marks, before + BATCH)
    assert fresh_weights.numpy().tolist() == [6.0, 12.0]
    assert fresh.get_state() == state
    _assert_same(_stream(fresh), _from(state))


def test_start_prefetch_during_a_live_loop_raises():
    """A live loop produces already: start_prefetch names it and changes nothing."""
    loader = _loader()
    loop = iter(loader)
    next(loop)
    with pytest.raises(resumeloader.StreamIntegrityError, match="a loop is live"):
        loader.start_prefetch()
    rest = [batch.numpy() for batch in loop]
    _assert_same(rest, _from(_state_at(1)))


def test_an_error_of_the_first_batch_is_raised_by_the_loop():
    """A record that fails while start_prefetch makes it fails the loop's first next(),
    as without start_prefetch."""
    data = np.arange(80, dtype=np.int64).reshape(40, 2) // 2
    pipeline = Pipeline(data, seed=0).map(fns.fail_at_index).batch(4)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    loader.advance(1)
    loader.start_prefetch()
    with pytest.raises(resumeloader.RecordError, match="bad record 7"):
        next(iter(loader))


def test_start_prefetch_with_tensor_stages_and_at_the_end():
    """With tensor stages (the loop reads the tf.data pipeline) the stream is unchanged;
    at the end of a finite loader the loop hands out nothing."""
    def scaled(batch, seeds):
        return batch * 2.0 + tf.cast(seeds[:, :1], tf.float32) * 0.0

    def loader_() -> ResumableLoader:
        return ResumableLoader.from_pipeline(_pipeline().tf_map(scaled), num_epochs=1)

    reference = loader_()
    reference.advance(4)
    want = _stream(reference)
    loader = loader_()
    loader.advance(4)
    loader.start_prefetch()
    _assert_same(_stream(loader), want)
    loader.start_prefetch()
    assert _stream(loader) == []
