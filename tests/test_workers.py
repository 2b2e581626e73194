"""Ordered thread and process workers: same stream, errors, crashes, clean shutdown."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import _worker_fns as fns
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import RecordError, WorkerError

WORKERS = [(0, "thread"), (1, "thread"), (2, "thread"), (1, "process"), (2, "process")]
WORKER_IDS = [f"{n}-{kind}" for n, kind in WORKERS]


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children()]


def _segments() -> list[str]:
    prefix = f"rl{os.getpid()}_"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))


def _worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("resumeloader-worker")]


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Every test must leave no worker process, thread or shared-memory segment behind."""
    yield
    gc.collect()
    leftovers = (_children(), _segments(), _worker_threads())
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
    return resumeloader.ResumableLoader(
        _records() if source is None else source,
        num_workers=num_workers,
        worker_type=worker_type,
        **options,
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


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"map_fn": lambda record, rng: record}, "map_fn"), ({"source": fns.CountingSource(8)}, None)],
    ids=["lambda-map_fn", "picklable-source"],
)
def test_process_workers_unpicklable_raises_at_construction(kwargs, name):
    """worker_type='process' with an unpicklable map_fn raises TypeError naming it."""
    if name is None:
        source = kwargs["source"]
        source.lock = threading.Lock()
        name = "source"
    with pytest.raises(TypeError) as excinfo:
        _loader(2, "process", **kwargs)
    assert f"`{name}` cannot be pickled" in str(excinfo.value)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"worker_type": "fork"}, ValueError), ({"num_workers": -1}, ValueError),
     ({"num_workers": 1.5}, TypeError)],
    ids=["bad-type", "negative", "float"],
)
def test_worker_arguments_invalid_raise(kwargs, error):
    """Invalid num_workers or worker_type are rejected at construction."""
    options = {"num_workers": 1, "worker_type": "thread", **kwargs}
    with pytest.raises(error) as excinfo:
        _loader(**options)
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
    loader = _loader(2, "process", map_fn=fns.slow, num_epochs=None)
    batches = iter(loader)
    next(batches)
    os.kill(_children()[0], signal.SIGKILL)
    with pytest.raises(WorkerError) as excinfo:
        for _ in range(50):
            next(batches)
    assert "died with signal SIGKILL" in str(excinfo.value)
    del batches


def test_iterator_closed_early_stops_workers():
    """Breaking out of the loop and dropping the iterator stops the workers."""
    loader = _loader(2, "process", num_epochs=None)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    assert loader.step == 3


def test_dataset_iterator_garbage_collected_stops_workers():
    """Dropping a dataset iterator and its loader stops the workers and frees memory."""
    loader = _loader(2, "process", num_epochs=None)
    iterator = iter(loader.dataset())
    next(iterator)
    assert len(_children()) == 2
    del iterator, loader


def test_keyboard_interrupt_in_loop_stops_workers():
    """A KeyboardInterrupt raised in the training loop leaves no worker behind."""
    loader = _loader(2, "process", num_epochs=None)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            raise KeyboardInterrupt
    assert loader.position == 6


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
            images, batch_size=4, seed=11, num_epochs=2, with_metadata=True, num_workers=1
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


_PARENT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    import multiprocessing, numpy as np, _worker_fns as fns, resumeloader
    if __name__ == "__main__":
        loader = resumeloader.ResumableLoader(
            np.zeros((40, 3), np.float32), batch_size=4, seed=0, map_fn=fns.slow,
            num_workers=2, worker_type="process")
        batches = iter(loader)
        next(batches)
        pids = [p.pid for p in multiprocessing.active_children()]
        print(" ".join(map(str, pids)), flush=True)
        sys.stdin.read()  # wait to be killed
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead
        return stat.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
def test_parent_killed_workers_exit_and_free_memory():
    """SIGKILL of the training process: its workers exit and their segments are freed."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, os.path.dirname(__file__)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    prefix = f"rl{parent.pid}_"
    assert len(workers) == 2
    assert any(name.startswith(prefix) for name in os.listdir("/dev/shm"))
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30  # a bound on waiting, not a performance assertion
    while time.monotonic() < deadline and (
        any(map(_alive, workers)) or any(n.startswith(prefix) for n in os.listdir("/dev/shm"))
    ):
        time.sleep(0.1)
    assert [pid for pid in workers if _alive(pid)] == []
    assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] == []
