"""Ordered thread and process workers: same stream, errors, crashes, clean shutdown."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import _collector
import _worker_fns as fns
import numpy as np
import psutil
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import RecordError, WorkerError

WORKERS = [(0, "thread"), (1, "thread"), (2, "thread"), (1, "process"), (2, "process")]
WORKER_IDS = [f"{n}-{kind}" for n, kind in WORKERS]


#: The processes this test process had before the running test began (a session's
#: storage servers or Dask cluster, started by whichever test of this pytest worker ran
#: first): not the test's. Set by `_no_leftovers`.
_EARLIER: set[int] = set()


def _children() -> list[int]:
    """The test's child processes (recursive): those that were not there before it."""
    return [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in _EARLIER]


def _segments() -> list[str]:
    prefix = f"rl{os.getpid()}_"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))


def _worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("resumeloader-worker")]


def _leftovers(before: tuple[set, set, set]) -> tuple[list, list, list]:
    now = (_children(), _segments(), _worker_threads())
    return tuple(sorted(set(items) - old) for items, old in zip(now, before, strict=True))


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Every test must leave no worker process, thread or shared-memory segment behind.

    Only what the test itself started counts (an earlier module's loader may still be
    finalised by TensorFlow's iterator cleanup), and it gets 5 s to go: a pool is
    stopped when its loader is collected, not necessarily by the time the test returns.
    """
    _EARLIER.clear()
    _EARLIER.update(p.pid for p in psutil.Process().children(recursive=True))
    before = (set(_children()), set(_segments()), set(_worker_threads()))
    yield
    _collector.assert_collects()  # a pool is stopped when its loader is collected
    deadline = time.monotonic() + 5.0
    while True:
        gc.collect()
        leftovers = _leftovers(before)
        if leftovers == ([], [], []) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert leftovers == ([], [], []), f"left behind: {leftovers}"


def _records(num_records: int = 40) -> np.ndarray:
    # Column 0 of record i is i, so user functions can see which record they got.
    return np.repeat(np.arange(num_records, dtype=np.float32)[:, None], 3, axis=1)


def _loader(
    num_workers: int = 0, worker_type: str = "thread", **kwargs
) -> resumeloader.ResumableLoader:
    options = {"batch_size": 6, "seed": 3, "num_epochs": 2, "map_fn": fns.augment}
    options.update(kwargs)
    source = options.pop("source", None)
    workers = options.pop("workers", None) or resumeloader.Workers(
        num_workers, kind=worker_type if num_workers else None, timeout=options.pop("timeout", None)
    )
    return resumeloader.ResumableLoader(
        _records() if source is None else source, workers=workers, **options
    )


def _drain(loader: resumeloader.ResumableLoader) -> list[np.ndarray]:
    return [batch.numpy() for batch in loader]


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    """The stream of the loader without workers."""
    return _drain(_loader())


@pytest.mark.parametrize(("num_workers", "worker_type"), WORKERS, ids=WORKER_IDS)
def test_stream_any_workers_equals_serial(reference, num_workers, worker_type):
    """Any number and kind of workers yields the serial stream, batch for batch."""
    stream = _drain(_loader(num_workers, worker_type))
    assert len(stream) == len(reference)
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, "process"), (1, "thread")), ((2, "thread"), (0, "thread"))],
    ids=["2process-to-1thread", "2thread-to-serial"],
)
def test_restore_with_other_workers_continues_exactly(reference, before, after):
    """A state saved with some workers resumes exactly with others (mid-epoch 1)."""
    first = _loader(*before)
    consumed = [batch.numpy() for _, batch in zip(range(9), first, strict=False)]
    resumed = _loader(*after)
    resumed.set_state(first.get_state())
    stream = consumed + _drain(resumed)
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_process_workers_large_array_source_streams_exactly():
    """A source too large for one pickle frame reaches process workers intact."""
    source = np.random.default_rng(0).random((12, 8192), dtype=np.float32)  # 384 KiB
    stream = _drain(_loader(1, "process", source=source, map_fn=None, num_epochs=1))
    serial = _drain(_loader(0, source=source, map_fn=None, num_epochs=1))
    for got, want in zip(stream, serial, strict=True):
        np.testing.assert_array_equal(got, want)


def test_process_worker_does_not_import_tensorflow():
    """Worker processes run the producer without importing TensorFlow."""
    loader = _loader(1, "process", map_fn=fns.tensorflow_imported, num_epochs=1)
    flags = np.concatenate(_drain(loader))
    assert flags.tolist() == [0] * 40


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_map_fn_error_in_worker_raises_record_error(worker_type):
    """A map_fn failure in a worker is a RecordError naming record, epoch and position."""
    loader = _loader(2, worker_type, map_fn=fns.fail_at_index, shuffle=False, num_epochs=1)
    with pytest.raises(RecordError) as excinfo:
        _drain(loader)
    error = excinfo.value
    assert (type(error), error.record_index, error.epoch, error.position) == (
        RecordError,
        fns.FAILING_INDEX,
        0,
        fns.FAILING_INDEX,
    )
    assert "bad record 7" in str(error)
    assert isinstance(error.__cause__, ValueError)


def test_spec_mismatch_in_process_worker_raises_record_spec_error():
    """A record of the wrong shape produced in a worker process is a RecordSpecError."""
    spec = tf.TensorSpec((4,), tf.float32)
    loader = _loader(1, "process", map_fn=None, output_signature=spec, num_epochs=1)
    with pytest.raises(resumeloader.RecordSpecError) as excinfo:
        _drain(loader)
    assert "Expected per record: float32[4]" in str(excinfo.value)


def _closure_over_lock():
    lock = threading.Lock()

    def fn(record, rng):
        with lock:
            return record

    return fn


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"map_fn": _closure_over_lock()}, "map_fn"), ({"source": fns.CountingSource(8)}, None)],
    ids=["map_fn-closing-over-a-lock", "source-holding-a-lock"],
)
def test_process_workers_unpicklable_raises_at_construction(kwargs, name):
    """Process workers with an unpicklable map_fn or source raise a TypeError naming it."""
    if name is None:
        source = kwargs["source"]
        source.lock = threading.Lock()
        name = "source"
    with pytest.raises(TypeError) as excinfo:
        _loader(2, "process", **kwargs)
    assert f"`{name}` cannot be pickled" in str(excinfo.value)


def test_process_workers_lambda_map_fn_streams_exactly(reference):
    """A lambda map_fn (pickled by value) runs in process workers: the serial stream."""
    noise = fns.augment
    stream = _drain(_loader(2, "process", map_fn=lambda record, rng: noise(record, rng)))
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"kind": "fork"}, ValueError), ({"num_workers": -1}, ValueError),
     ({"num_workers": 1.5}, TypeError), ({"timeout": float("nan")}, ValueError),
     ({"timeout": float("inf")}, ValueError), ({"timeout": 0}, ValueError),
     ({"timeout": "1"}, TypeError), ({"timeout": True}, TypeError),
     ({"timeout": 1.0, "num_workers": 0}, ValueError)],
    ids=["bad-type", "negative", "float", "timeout-nan", "timeout-inf", "timeout-zero",
         "timeout-str", "timeout-bool", "timeout-without-workers"],
)
def test_worker_arguments_invalid_raise(kwargs, error):
    """Invalid `Workers` fields are rejected when the value is made."""
    options = {"num_workers": 1, "kind": "thread", **kwargs}
    with pytest.raises(error) as excinfo:
        resumeloader.Workers(**options)
    assert "Received:" in str(excinfo.value)


def test_source_failing_to_unpickle_in_worker_raises_worker_error():
    """A source that cannot be rebuilt in the worker is a WorkerError naming the cause."""
    loader = _loader(1, "process", source=fns.ParentOnlySource(10), map_fn=None)
    with pytest.raises(WorkerError) as excinfo:
        _drain(loader)
    assert "could not rebuild the source and map_fn" in str(excinfo.value)
    assert "RuntimeError: this source cannot be opened in a worker" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, RuntimeError)


def test_worker_killing_itself_raises_worker_error():
    """A worker process that dies mid-batch is a WorkerError naming that batch."""
    loader = _loader(2, "process", map_fn=fns.kill_self_at_index, shuffle=False, num_epochs=1)
    with pytest.raises(WorkerError) as excinfo:
        _drain(loader)
    error = excinfo.value
    assert (error.record_index, error.epoch, error.position) == (6, 0, 6)
    assert "signal SIGKILL" in str(error)
    assert loader.position == 6


def test_worker_killed_from_outside_raises_worker_error():
    """SIGKILL sent to a busy worker process surfaces as a WorkerError, not a hang."""
    before = set(_children())  # a session's Dask workers are children too: not ours
    loader = _loader(2, "process", map_fn=fns.slow, num_epochs=None)
    batches = iter(loader)
    next(batches)
    started = [pid for pid in _children() if pid not in before]
    assert started, "the loader started no worker process"
    os.kill(started[0], signal.SIGKILL)
    with pytest.raises(WorkerError) as excinfo:
        for _ in range(50):
            next(batches)
    assert "died with signal SIGKILL" in str(excinfo.value)
    del batches


def test_worker_killed_next_iteration_replaces_it_and_streams_exactly():
    """After a worker died, iterating again starts a new one and continues the exact stream."""
    # 600 records of ~2 ms: the workers are still busy when the test kills one, even on a
    # loaded machine (with 40 they could finish the epoch first: no WorkerError to see).
    loader = _loader(2, "process", map_fn=fns.slow, num_epochs=1, source=_records(600))
    batches = iter(loader)
    consumed = [next(batches).numpy()]
    before = _children()
    os.kill(before[0], signal.SIGKILL)
    with pytest.raises(WorkerError):
        for _ in range(50):
            consumed.append(next(batches).numpy())
    del batches
    stream = consumed + _drain(loader)
    serial = _drain(_loader(0, map_fn=fns.slow, num_epochs=1, source=_records(600)))
    assert len(stream) == len(serial)
    for got, want in zip(stream, serial, strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(set(_children()) - set(before)) == 1


def test_worker_timeout_stalled_process_raises_worker_error_naming_batch():
    """A worker process stalled on a batch past its timeout is stopped; WorkerError names it."""
    loader = _loader(
        2, "process", map_fn=fns.stall_at_index, shuffle=False, num_epochs=1, timeout=1.0
    )
    with pytest.raises(WorkerError) as excinfo:
        _drain(loader)
    error = excinfo.value
    assert (error.record_index, error.epoch, error.position) == (6, 0, 6)
    assert "within timeout=1.0 s (Workers.timeout)" in str(error)
    assert loader.position == 6
    assert len(_children()) == 1  # the stalled one was stopped


def test_worker_timeout_stalled_thread_raises_worker_error_naming_batch():
    """A worker thread stalled on a batch past its timeout raises a WorkerError naming it."""
    fns.RELEASE.clear()
    loader = _loader(
        2, "thread", map_fn=fns.wait_at_index, shuffle=False, num_epochs=1, timeout=0.5
    )
    try:
        with pytest.raises(WorkerError) as excinfo:
            _drain(loader)
    finally:
        fns.RELEASE.set()
        for thread in threading.enumerate():
            if thread.name.startswith("resumeloader-worker"):
                thread.join(10)
    error = excinfo.value
    assert (error.record_index, error.epoch, error.position) == (6, 0, 6)
    assert "within timeout=0.5 s (Workers.timeout)" in str(error)
    assert loader.position == 6


def _take(loader: resumeloader.ResumableLoader, num_batches: int) -> list[np.ndarray]:
    return [batch.numpy() for _, batch in zip(range(num_batches), loader, strict=False)]


def test_process_workers_persist_across_iterations_and_epochs():
    """The same worker processes serve a for loop, then one dataset per epoch (as Keras)."""
    loader = _loader(2, "process", num_epochs=3)
    _take(loader, 3)
    pids = _children()
    for _ in range(2):
        for _ in loader.dataset(rest_of_epoch=True):
            loader.advance()
    assert len(pids) == 2
    assert _children() == pids
    assert loader.epoch == 2


def test_abandoned_iteration_then_restore_streams_exactly(reference):
    """Leaving a loop with batches in flight, restoring the start and iterating again
    yields the serial stream: the abandoned iteration's batches are dropped."""
    loader = _loader(2, "process", map_fn=fns.augment)
    start = loader.get_state()
    _take(loader, 3)
    loader.set_state(start)
    stream = _drain(loader)
    assert len(stream) == len(reference)
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_superseded_iteration_raises_and_newer_streams_exactly(reference):
    """A second dataset() iteration supersedes the first on the same worker processes:
    reading the first again raises (each would hand out the same batches), while the
    second yields the whole stream from the position it started at."""
    loader = _loader(2, "process")
    first = iter(loader.dataset())
    head = [next(first).numpy() for _ in range(2)]
    second = iter(loader.dataset())
    stream = [batch.numpy() for batch in second]
    # Batches the first iteration had prefetched may still come out; then it raises.
    with pytest.raises(tf.errors.OpError, match="Two iterations of this loader's dataset"):
        for _ in reference:
            next(first)
    del first, second
    for got, want in zip(head, reference, strict=False):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_loader_close_stops_workers_and_iterating_again_restarts_them(reference):
    """close() stops the worker processes; the next iteration starts new ones, exactly."""
    loader = _loader(2, "process")
    head = _take(loader, 2)
    running = len(_children())
    loader.close()
    stopped = _children()
    stream = head + _drain(loader)
    loader.close()
    assert (running, stopped, _children()) == (2, [], [])
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_loader_with_block_closes_workers():
    """Leaving a ``with`` block closes the loader's worker processes."""
    with _loader(2, "process") as loader:
        _take(loader, 1)
        running = len(_children())
    assert (running, _children()) == (2, [])


def test_loop_left_early_keeps_position_and_workers():
    """Breaking out of the loop keeps the position of the batches handed out; the workers
    stay for the next iteration."""
    loader = _loader(2, "process", num_epochs=None)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    assert loader.step == 3
    assert len(_children()) == 2


def test_dataset_iterator_garbage_collected_stops_workers():
    """Dropping a dataset iterator and its loader stops the workers and frees memory."""
    loader = _loader(2, "process", num_epochs=None)
    iterator = iter(loader.dataset())
    next(iterator)
    assert len(_children()) == 2
    del iterator, loader


def _workers_gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("iterated", [False, True], ids=["dataset-built", "dataset-iterated"])
def test_loader_dropped_after_dataset_stops_workers_without_gc(iterated):
    """A loader and its dataset dropped: the workers stop at once, without the cyclic
    garbage collector (0.2.0 kept them until it ran: the loader was in a reference cycle
    through its dataset's generator)."""
    loader = _loader(2, "process", num_epochs=None)
    dataset = loader.dataset()
    if iterated:
        iterator = iter(dataset)
        next(iterator)
        loader.advance()
        del iterator
    pids = _children()
    assert len(pids) == 2
    gc.disable()
    try:
        del loader, dataset
        assert _workers_gone(pids), f"workers {pids} still alive with the loader dropped"
    finally:
        gc.enable()


def test_loader_dropped_iterator_kept_streams_then_stops_workers(reference):
    """An iterator outliving its loader and dataset still streams; the workers stop when
    the iterator goes, without the cyclic garbage collector."""
    iterator = iter(_loader(2, "process").dataset())
    pids = _children()
    gc.disable()
    try:
        stream = [next(iterator).numpy() for _ in range(3)]
        assert len(_children()) == 2
        del iterator
        assert _workers_gone(pids), f"workers {pids} still alive with the iterator dropped"
    finally:
        gc.enable()
    for got, want in zip(stream, reference, strict=False):
        np.testing.assert_array_equal(got, want)


def test_dataset_kept_loader_dropped_still_streams_exactly(reference):
    """A dataset outlives the loader it came from (it keeps what its generator needs)."""
    dataset = _loader(2, "process").dataset()
    gc.collect()
    stream = [batch.numpy() for batch in dataset]
    del dataset
    assert len(stream) == len(reference)
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_keyboard_interrupt_in_loop_then_iteration_continues_exactly(reference):
    """After a KeyboardInterrupt raised in the loop, the loader continues the exact stream."""
    loader = _loader(2, "process")
    head = []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            head.append(batch.numpy())
            raise KeyboardInterrupt
    stream = head + _drain(loader)
    assert loader.exhausted
    for got, want in zip(stream, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_thread_workers_exhaustion_stops_threads():
    """Thread workers are joined when the stream is exhausted."""
    loader = _loader(2, "thread", num_epochs=1)
    _drain(loader)
    assert _worker_threads() == []


@pytest.mark.parametrize(("num_workers", "worker_type"), WORKERS[:2] + WORKERS[3:4],
                         ids=WORKER_IDS[:2] + WORKER_IDS[3:4])
def test_read_batch_source_without_map_fn_reads_whole_batches(num_workers, worker_type):
    """A source with read_batch yields the same records as per-record reads, batched."""
    source = fns.CountingSource(20)
    loader = _loader(num_workers, worker_type, source=source, map_fn=None, num_epochs=1)
    stream = np.concatenate(_drain(loader))
    order = np.concatenate([loader.sampler.epoch_indices(0, 0, 20)])
    np.testing.assert_array_equal(stream, source.data[order])
    if num_workers == 0 or worker_type == "thread":  # a process worker counts in its own copy
        assert [len(call) for call in source.batch_calls] == [6, 6, 6, 2]
        assert source.item_calls == 1  # record 0, read once to infer the element spec


def _augmented(dataset: tf.data.Dataset) -> tf.data.Dataset:
    def augment(image, meta):
        seeds = tf.random.experimental.stateless_split(meta["seed"])
        flip_seed, brightness_seed = tf.unstack(seeds)
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        return tf.image.stateless_random_brightness(image, 0.5, brightness_seed), meta["index"]

    return dataset.unbatch().map(augment, num_parallel_calls=tf.data.AUTOTUNE)


def test_metadata_seed_stateless_tf_augmentation_resumes_exactly():
    """Stateless TF augmentation keyed by the metadata seed gives identical bytes after restore."""
    images = np.random.default_rng(0).random((30, 4, 4, 3), dtype=np.float32)

    def make():
        return resumeloader.ResumableLoader(
            images, batch_size=4, seed=11, num_epochs=2, with_metadata=True,
            workers=resumeloader.Workers(1),
        )

    def run(loader, num_batches=-1):
        # Counted by hand below (advance(10)), so the records may be unbatched.
        dataset = _augmented(loader.dataset().take(num_batches).unguarded())
        return [(image.numpy().tobytes(), int(index)) for image, index in dataset]

    full = run(make())
    first = make()
    head = run(first, num_batches=10)
    first.advance(10)
    resumed = make()
    resumed.set_state(first.get_state())
    tail = run(resumed)
    assert head + tail == full
    epochs_of_record: dict[int, set[bytes]] = {}
    for image, index in full:
        epochs_of_record.setdefault(index, set()).add(image)
    assert all(len(images) == 2 for images in epochs_of_record.values())  # seeds vary by epoch
