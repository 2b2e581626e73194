"""Workers("auto") in a loader: the stream of no workers whatever it decides, across a
restore mid-epoch; a checkpoint holds no decision; decisions in stats() and describe()."""

from __future__ import annotations

import json

import _worker_fns as fns
import numpy as np
import pytest
import tensorflow as tf

from resumeloader import ResumableLoader, Tuning, Workers

_DATA = np.arange(47 * 3, dtype=np.float32).reshape(47, 3)
FLIPPING = Workers("auto", options=Tuning(decide=fns.flip_workers))


def _loader(workers: Workers | None, map_fn=fns.augment, num_epochs: int = 2) -> ResumableLoader:
    return ResumableLoader(_DATA, batch_size=4, seed=3, num_epochs=num_epochs, map_fn=map_fn,
                           workers=workers)


def _eager(loader: ResumableLoader, steps: int | None = None) -> list[bytes]:
    out = []
    for batch in loader:
        out.append(batch.numpy().tobytes())
        if steps is not None and len(out) == steps:
            break
    return out


def _graph(loader: ResumableLoader) -> list[bytes]:
    out = []
    for batch in loader.dataset():
        out.append(batch.numpy().tobytes())
        loader.advance()
    return out


@pytest.fixture(scope="module")
def reference() -> list[bytes]:
    with _loader(None) as loader:
        return _eager(loader)


@pytest.mark.parametrize("consume", [_eager, _graph], ids=["for-batch", "dataset"])
def test_auto_flipping_every_two_batches_equals_no_workers(consume, reference):
    """Threads, none, processes and 3 threads in turn, two batches each: the same bytes as
    Workers(), by both ways of consuming."""
    with _loader(FLIPPING) as loader:
        assert consume(loader) == reference
        assert len(loader.stats().decisions) >= len(reference) // 2 - 1


def test_auto_restored_mid_epoch_continues_the_stream_of_no_workers(reference):
    """Broken mid-epoch (between flips), restored into a fresh auto loader: the rest of the
    stream of Workers(); the state is the one Workers() writes at that point."""
    with _loader(FLIPPING) as first, _loader(None) as plain:
        head = _eager(first, steps=5)
        _eager(plain, steps=5)
        state = json.loads(json.dumps(first.get_state()))
        assert state == plain.get_state()  # no decision in the checkpoint
    with _loader(Workers("auto", options=Tuning(decide=lambda n: fns.flip_workers(n + 1)))) as (
        fresh
    ):
        fresh.set_state(state)
        assert head + _eager(fresh) == reference
        assert fresh.stats().decisions  # the restored run flipped too


def test_auto_restored_through_a_tf_checkpoint_with_no_workers(reference, tmp_path):
    """A checkpoint written by an auto loader restores into Workers() and back."""
    with _loader(FLIPPING) as auto:
        head = _eager(auto, steps=7)
        assert auto.stats().decisions  # written by a loader that flipped
        path = tf.train.Checkpoint(loader=auto).write(str(tmp_path / "ckpt"))
    with _loader(None) as plain:
        tf.train.Checkpoint(loader=plain).read(path).assert_consumed()
        assert head + _eager(plain) == reference


def test_auto_measured_decisions_show_in_stats_and_describe(caplog):
    """Measured trials decide within the run; stats() lists each decision, describe()
    names the workers now, and the stream is that of no workers."""
    # 96 batches of >= 8 ms: trials of 20 ms each (4 batches alone, <= 19 in 4 threads
    # with their start-up), each twice if threads win, end well before.
    with _loader(None, fns.slow, num_epochs=8) as plain:
        reference = _eager(plain)
    auto = Workers("auto", options=Tuning(trial_batches=1, trial_seconds=0.02, cpus=1))
    with _loader(auto, fns.slow, num_epochs=8) as loader:
        with caplog.at_level("INFO", logger="resumeloader.workers"):
            got = _eager(loader)
        stats, text = loader.stats(), loader.describe()
    assert got == reference
    assert "auto: " in text and f"Workers('auto') after batch {stats.decisions[-1]['batch']}" in (
        text)
    logged = [r for r in caplog.records if r.name == "resumeloader.workers"]
    assert len(logged) == len(stats.decisions) >= 1
    for decision in stats.decisions:
        assert decision["kind"] in ("inline", "thread", "process") and decision["why"]


def test_auto_without_python_stages_takes_the_path_of_no_workers():
    """In-memory arrays with no Python stage: auto leaves them to TensorFlow, as Workers()."""
    from resumeloader.handout import engine as engine_lib
    from resumeloader.tfdata import paths

    def path(workers: Workers) -> str:
        loader = ResumableLoader(_DATA, batch_size=4, seed=3, num_epochs=1, workers=workers)
        engine = engine_lib.Engine(loader.plan, loader.workers, with_metadata=False)
        return paths.path_class(engine).name

    assert path(Workers("auto")) == path(Workers()) != "records"


# -- window="auto": the tasks in flight --------------------------------------------------
_WINDOWS = (1, 6, 2, 9)


def _windowed(loader: ResumableLoader, offset: int = 0) -> ResumableLoader:
    """`loader`'s thread workers with their window changed every two batches (the test hook
    of `AutoDepth`: the loader's own backend)."""
    loader._engine.backend.depth.decide = lambda n: _WINDOWS[(n + offset) // 2 % len(_WINDOWS)]
    return loader


def test_window_auto_changing_mid_epoch_restored_equals_no_workers(reference):
    """Thread workers whose window changes every two batches, broken mid-epoch and restored
    into a fresh loader doing the same: the stream and the state of Workers()."""
    with _windowed(_loader(Workers(2, window="auto"))) as first, _loader(None) as plain:
        head = _eager(first, steps=9)
        _eager(plain, steps=9)
        state = json.loads(json.dumps(first.get_state()))
        assert state == plain.get_state()  # no window in the checkpoint
        decisions = [d for d in first.stats().decisions if "window" in d]
        assert {d["window"] for d in decisions} >= {1, 6, 2}
        assert "window='auto' after batch" in str(first.stats())
    with _windowed(_loader(Workers(2, window="auto")), offset=9) as fresh:
        fresh.set_state(state)
        assert head + _eager(fresh) == reference


def test_auto_workers_and_windows_flipping_restored_equals_no_workers(reference):
    """Workers('auto') changing its workers and their window mid-epoch, by both ways of
    consuming and across a restore: the stream of Workers()."""
    auto = Workers("auto", options=Tuning(decide=fns.flip_workers_and_windows))
    with _loader(auto) as loader:
        assert _graph(loader) == reference
        assert any("window" in d for d in loader.stats().decisions)
    with _loader(auto) as first:
        head = _eager(first, steps=11)
        state = first.get_state()
    then = Workers("auto", options=Tuning(decide=lambda n: fns.flip_workers_and_windows(n + 11)))
    with _loader(then) as fresh:
        fresh.set_state(state)
        assert head + _eager(fresh) == reference
