"""Who consumes a loader, checked: one live eager loop, no position change under it,
dataset() iterations that cannot be read twice or over-counted, the batch in flight."""

from __future__ import annotations

import gc
import itertools
import json
import os
import re
import signal
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


def _loader(**kwargs) -> ResumableLoader:
    options = dict(batch_size=4, seed=3, num_epochs=2, shuffle=False)
    options.update(kwargs)
    return ResumableLoader(np.arange(20), **options)


def _ids(batch) -> list[int]:
    return np.asarray(batch).tolist()


# -- one live `for batch in loader` ----------------------------------------------------


def _zip_two_loops(loader):
    return list(zip(loader, loader, strict=False))


def _nested_loops(loader):
    return [(a, b) for a in loader for b in loader]


def _two_threads(loader):
    errors: list[BaseException] = []
    first = iter(loader)
    next(first)

    def second():
        try:
            next(iter(loader))
        except BaseException as err:  # handed to the test thread
            errors.append(err)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    first.close()
    raise errors[0]


@pytest.mark.parametrize(
    "consume",
    [_zip_two_loops, _nested_loops, _two_threads],
    ids=["zip-loader-loader", "nested-loops", "two-threads"],
)
def test_iter_second_live_iterator_raises_naming_the_first(consume):
    """A second `for batch in loader` while one is live raises, naming the live one."""
    loader = _loader()

    with pytest.raises(resumeloader.ResumeLoaderError, match="second live iterator") as info:
        consume(loader)

    assert "started at" in str(info.value) and "test_consumption.py" in str(info.value)
    assert loader.position <= 4  # at most the first loop's one batch was counted


def test_iter_after_loop_left_by_break_starts_a_new_loop():
    """Leaving a loop (break) ends it: the next loop continues with the next batch."""
    loader = _loader()
    for batch in loader:
        first = _ids(batch)
        break

    rest = [_ids(b) for b in loader]

    assert first == [0, 1, 2, 3]
    assert rest[0] == [4, 5, 6, 7] and len(rest) == 9
    assert loader.position == 40


def test_iter_abandoned_iterator_collected_frees_the_loader():
    """An iterator dropped mid-way ends when collected; its handed-out batch stays counted."""
    loader = _loader()
    iterator = iter(loader)
    next(iterator)
    del iterator
    gc.collect()

    assert _ids(next(iter(loader))) == [4, 5, 6, 7]


def test_iter_iterator_closed_explicitly_frees_the_loader():
    """close() on a live iterator ends it, so a new loop may start."""
    loader = _loader()
    iterator = iter(loader)
    next(iterator)
    iterator.close()

    assert next(iterator, None) is None
    assert _ids(next(iter(loader))) == [4, 5, 6, 7]


# -- no position change under a live loop ------------------------------------------------


def _advance(loader, _state, _tmp_path):
    loader.advance()


def _set_state(loader, state, _tmp_path):
    loader.set_state(state)


def _checkpoint_restore(loader, _state, tmp_path):
    path = tf.train.Checkpoint(loader=_loader()).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(loader=loader).read(path)


@pytest.mark.parametrize(
    "change",
    [_advance, _set_state, _checkpoint_restore],
    ids=["advance", "set_state", "checkpoint-restore"],
)
def test_iter_position_change_during_live_loop_raises(change, tmp_path):
    """advance(), set_state() or a restore inside `for batch in loader` raises, unchanged."""
    loader = _loader()
    state = loader.get_state()
    seen = []

    with pytest.raises(resumeloader.ResumeLoaderError, match="during a live") as info:
        for batch in loader:
            seen.append(_ids(batch))
            change(loader, state, tmp_path)

    assert "started at" in str(info.value)
    assert seen == [[0, 1, 2, 3]]
    assert loader.position == 4


def test_iter_save_in_loop_body_records_the_python_position(tmp_path):
    """During a loop the position lives in Python; every reader sees it (no variable write)."""
    loader = _loader(num_epochs=1)
    checkpoint = tf.train.Checkpoint(loader=loader)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=None)
    for step, _ in enumerate(loader):
        if step == 1:
            path = manager.save()
            state = loader.get_state()
            break
    fresh = _loader(num_epochs=1)
    tf.train.Checkpoint(loader=fresh).read(path).expect_partial()

    assert fresh.position == 8
    assert state["offset"] == 8
    assert [_ids(b) for b in fresh] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]


# -- dataset() iterations -----------------------------------------------------------------


def _records_path(**kwargs) -> ResumableLoader:
    # A map_fn makes the generator produce one batch per request (the gather path of a
    # plain array produces index arrays 16 batches at a time).
    return _loader(map_fn=lambda record, rng: record, **kwargs)


def test_dataset_two_iterations_read_at_once_raise():
    """zip(ds, ds) reads two iterations of one loader: it raises instead of pairing twins."""
    loader = _records_path(prefetch=None)
    ds = loader.dataset()
    pairs = []

    with pytest.raises(tf.errors.OpError, match="Two iterations of this loader") as info:
        for a, b in tf.data.Dataset.zip((ds, ds)):
            pairs.append((_ids(a), _ids(b)))
            loader.advance()

    assert "StreamIntegrityError" in str(info.value)
    assert len(pairs) <= 1  # its first step, before the second iteration started
    assert loader.position <= 4


def test_dataset_while_eager_loop_live_raises():
    """Iterating dataset() inside a live `for batch in loader` raises (two consumers)."""
    loader = _loader()

    with pytest.raises(tf.errors.OpError, match="while a `for batch in loader` is live"):
        for _ in loader:
            next(iter(loader.dataset()))

    assert loader.position == 4


def _mixed_with_other_data(loader):
    other = tf.data.Dataset.from_tensors(tf.constant([-1, -1, -1, -1], tf.int64)).repeat()
    return tf.data.Dataset.sample_from_datasets([loader.dataset(), other], seed=1)


def _advance_twice_per_batch(loader):
    return loader.dataset()


@pytest.mark.parametrize(
    ("make", "advances"),
    [(_mixed_with_other_data, 1), (_advance_twice_per_batch, 2)],
    ids=["sample-from-datasets", "advance-twice-per-batch"],
)
def test_dataset_advance_past_produced_batches_raises(make, advances):
    """Counting batches that did not come from the loader raises once it outruns production."""
    loader = _loader(num_epochs=None, prefetch=1)
    steps = 0

    with pytest.raises(resumeloader.ResumeLoaderError, match="past the last batch") as info:
        for _ in make(loader):
            loader.advance(advances)
            steps += 1
            assert steps < 100, "the over-count was never detected"

    assert "sample_from_datasets" in str(info.value)


def test_dataset_advance_past_end_of_finite_loader_raises():
    """An advance past the last batch of a finite loader raises (0.2.0 clamped it to the
    end, silently), even once the iteration produced every batch; the position stays."""
    loader = _loader()  # 2 epochs of 5 batches
    assert len(list(loader.dataset())) == 10

    loader.advance(9)
    with pytest.raises(resumeloader.StreamIntegrityError, match="past the end") as info:
        loader.advance(2)

    assert "Received: advance by 2 from position 36; 1 batch is left" in str(info.value)
    assert loader.position == 36
    loader.advance()
    assert loader.exhausted
    with pytest.raises(resumeloader.StreamIntegrityError, match="past the end"):
        loader.advance()


def test_dataset_advance_past_end_before_iterating_raises():
    """Skipping more batches than a finite loader has raises too."""
    loader = _loader(num_epochs=1)

    with pytest.raises(resumeloader.StreamIntegrityError, match="past the end"):
        loader.advance(6)

    assert loader.position == 0


def test_dataset_sample_from_datasets_wrong_loader_advanced_raises():
    """sample_from_datasets over two finite loaders, the wrong one advanced for every batch:
    an error once it passes its own end, not an epoch ended early (0.2.0 clamped: the
    loader read as exhausted with half its records never trained)."""
    first, second = _loader(num_epochs=1), _loader(num_epochs=1, seed=4, shuffle=True)
    mixed = tf.data.Dataset.sample_from_datasets([first.dataset(), second.dataset()], seed=1)
    batches = list(mixed)  # every batch of both produced (read-ahead as far as it goes)
    assert len(batches) == 10

    with pytest.raises(resumeloader.StreamIntegrityError, match="past the end"):
        for _ in batches:
            first.advance()

    assert first.position == 20 and second.position == 0


@pytest.mark.parametrize("num_batches", [1, 7], ids=["one-past", "several-past"])
def test_graph_advance_past_end_of_finite_loader_fails_the_step(num_batches):
    """Inside a tf.function an advance past the end fails the step (InvalidArgumentError
    naming the cause); the position stays."""
    loader = _loader(num_epochs=1)
    loader.advance(4)
    step = tf.function(lambda n: loader.advance(n), autograph=False)

    with pytest.raises(tf.errors.InvalidArgumentError, match="past the end of a finite loader"):
        step(tf.constant(num_batches + 1, tf.int64))

    assert loader.position == 16
    step(tf.constant(1, tf.int64))
    assert loader.exhausted


def test_dataset_advance_before_iterating_skips_batches():
    """An advance with no iteration running skips batches on purpose, unchecked."""
    loader = _loader()

    loader.advance(3)

    assert _ids(next(iter(loader.dataset()))) == [12, 13, 14, 15]


def test_dataset_iterator_from_before_restore_then_advance_raises():
    """An iterator started before set_state serves the old position: advancing on it raises."""
    loader = _records_path(prefetch=None)
    iterator = iter(loader.dataset())
    next(iterator)
    loader.advance()
    saved = loader.get_state()
    next(iterator)
    loader.advance()

    loader.set_state(saved)

    # Depending on how far tf.data read ahead, the old iterator fails when asked for a
    # batch it had not produced yet, or its read-ahead batch is refused at the advance.
    with pytest.raises((tf.errors.OpError, resumeloader.ResumeLoaderError)) as info:
        next(iterator)
        loader.advance()
    assert re.search(r"restored .* while an iterator|Two iterations", str(info.value))
    assert loader.position == 4
    # Collected now, not by a later GC (CPython 3.11 can fail an ast.parse that a
    # collection with finalizers interrupts).
    del info, iterator
    gc.collect()


# -- the batch in flight ------------------------------------------------------------------


def test_excluding_in_flight_in_except_block_saves_before_the_failed_batch(tmp_path):
    """A save in `except` with excluding_in_flight() resumes with the batch whose step failed."""
    loader = _loader(num_epochs=1)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path), 2)
    trained = []
    try:
        for batch in loader:
            if len(trained) == 2:
                raise RuntimeError("the training step failed")
            trained.append(_ids(batch))
    except RuntimeError:
        with loader.excluding_in_flight():
            manager.save()
    fresh = _loader(num_epochs=1)
    tf.train.Checkpoint(loader=fresh).read(manager.latest_checkpoint).expect_partial()

    assert trained + [_ids(b) for b in fresh] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]
    ]
    assert loader.position == 12  # outside the block, the failed batch still counts


def test_excluding_in_flight_in_live_loop_reads_the_position_before_the_batch():
    """Inside the loop body the block gives the position before the batch handed out."""
    loader = _loader()
    inside = []
    for _ in itertools.islice(loader, 2):
        with loader.excluding_in_flight() as position:
            inside.append((position, loader.get_state()["offset"]))
        inside.append(loader.position)

    assert inside == [(0, 0), 4, (4, 4), 8]


def test_excluding_in_flight_after_position_change_changes_nothing():
    """Once the position moved after the loop ended, no batch is in flight any more."""
    loader = _loader()
    for _ in loader:
        break
    loader.advance()

    with loader.excluding_in_flight() as position:
        assert position == loader.position == 8


@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed{s}")
def test_iter_saves_at_random_steps_resume_exactly(seed, tmp_path):
    """States saved at random steps of a loop, by every save path, each resume exactly."""
    rng = np.random.default_rng(seed)
    make = lambda: ResumableLoader(np.arange(37), batch_size=5, seed=seed, num_epochs=3)  # noqa: E731
    reference = [_ids(b) for b in make()]
    loader = make()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(loader=loader), str(tmp_path / "manager"), max_to_keep=None
    )
    saved = []  # (steps consumed, how to restore a fresh loader)
    for step, _ in enumerate(loader):
        way = rng.integers(4)
        if way == 0:
            state = loader.get_state()
            saved.append((step + 1, lambda fresh, s=state: fresh.set_state(s)))
        elif way == 1:
            path = tf.train.Checkpoint(loader=loader).write(str(tmp_path / f"write{step}"))
            saved.append((step + 1, lambda f, p=path: tf.train.Checkpoint(loader=f).read(p)))
        elif way == 2:
            path = manager.save()
            saved.append((step + 1, lambda f, p=path: tf.train.Checkpoint(loader=f).read(p)))
    for consumed, restore in saved:
        fresh = make()
        restore(fresh)
        assert [_ids(b) for b in fresh] == reference[consumed:]


_PREEMPTED_JOB = textwrap.dedent(
    """
    import json, signal, sys, time
    import numpy as np, tensorflow as tf
    import resumeloader

    ckpt_dir, trace_path, slow_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loader = resumeloader.ResumableLoader(np.arange(40), batch_size=4, seed=1, num_epochs=1)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), ckpt_dir, 2)
    resumeloader.restore(manager, loader)

    def on_sigterm(signum, frame):  # a preemption notice: save and leave
        with loader.excluding_in_flight():  # the step in progress did not finish
            manager.save()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    with open(trace_path, "a") as trace:
        for step, batch in enumerate(loader):
            print("in step", step, flush=True)
            if step == slow_step:
                time.sleep(60)  # the training step; SIGTERM arrives here
            trace.write(json.dumps(batch.numpy().tolist()) + "\\n")  # the step is done
            trace.flush()
    print("done", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("excluding", [True, False], ids=["excluding-in-flight", "plain-save"])
def test_sigterm_save_during_step_keeps_the_batch_only_excluding_in_flight(tmp_path, excluding):
    """SIGTERM during a step: a save excluding the batch in flight trains it after the restore;
    a plain save (the batch counted when handed out) loses it."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    trace = tmp_path / "trace.jsonl"
    job_code = _PREEMPTED_JOB
    if not excluding:
        job_code = job_code.replace("with loader.excluding_in_flight():", "if True:")
    command = [sys.executable, "-c", job_code, str(tmp_path / "ckpt"), str(trace)]
    # cwd: `python -c` imports from its working directory first.
    job = subprocess.Popen([*command, "3"], stdout=subprocess.PIPE, text=True, env=env,
                           cwd=tmp_path)
    try:
        for line in job.stdout:
            if line.strip() == "in step 3":
                job.send_signal(signal.SIGTERM)
                break
        assert job.wait(timeout=_limits.EXIT) == 128 + signal.SIGTERM
    finally:
        job.kill()
    resumed = subprocess.run([*command, "-1"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=_limits.PROCESS, check=False)

    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.splitlines()[0] == "in step 0"
    trained = [json.loads(line) for line in trace.read_text().splitlines()]
    order = resumeloader.IndexSampler(40, seed=1).epoch_indices(0, 0, 40).tolist()
    if excluding:
        assert [i for batch in trained for i in batch] == order
    else:
        assert trained == [order[i : i + 4] for i in (0, 4, 8, *range(16, 40, 4))]
