"""Module-level user code for worker tests: picklable, and free of TensorFlow on purpose.

Spawned worker processes import this module to unpickle these functions; importing
TensorFlow here would hide whether the workers themselves import it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np

FAILING_INDEX = 7


def augment(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Adds keyed noise, so that any change of order or keying changes the output."""
    return record + rng.normal(size=record.shape).astype(record.dtype)


def augment_batch(batch: np.ndarray, rngs) -> np.ndarray:
    """`augment`, vectorised over a batch: each row's keyed noise from its own generator."""
    noise = np.stack([g.normal(size=batch.shape[1:]) for g in rngs]) if len(rngs) else 0
    return batch + np.asarray(noise, dtype=batch.dtype)


def flip_scale_batch(batch: tuple, rngs) -> tuple:
    """A row-wise image-like augmentation: per-row flip of the last axis and scale."""
    images, labels = batch
    flip = rngs.random() < 0.5
    images = np.where(flip[:, None], images[:, ::-1], images)
    scale = rngs.uniform(0.5, 1.5).astype(images.dtype)
    return images * scale[:, None], labels


def flip_scale_into(batch: tuple, rngs, out: tuple) -> tuple:
    """`flip_scale_batch` writing its images into the loader's ``out`` (``map_batch(...,
    out=True)``); the same values."""
    images, labels = batch
    flip = rngs.random() < 0.5
    images = np.where(flip[:, None], images[:, ::-1], images)
    scale = rngs.uniform(0.5, 1.5).astype(images.dtype)
    np.multiply(images, scale[:, None], out=out[0])
    return out[0], labels


def mix_rows_batch(batch: np.ndarray, rngs) -> np.ndarray:
    """Not row-wise: every row gets a keyed share of the batch mean (mixup-like)."""
    weight = rngs.random().astype(batch.dtype)[:, None]
    return batch * (1 - weight) + weight * batch.mean(axis=0, keepdims=True)


def mix_rows_batch_pair(batch: tuple, rngs) -> tuple:
    """`mix_rows_batch` on the images of an (images, labels) batch."""
    return mix_rows_batch(batch[0], rngs), batch[1]


def augment_tokens(record: dict, rng: np.random.Generator) -> dict:
    """Drops the label and adds keyed noise to a record's tokens."""
    noise = rng.integers(0, 3, size=len(record["tokens"]))
    return {"text": record["text"], "tokens": np.asarray(record["tokens"]) + noise}


def decode_bytes(record: bytes, rng: np.random.Generator) -> dict:
    """A stored record's bytes and its bytes as tokens, with keyed noise (ragged)."""
    tokens = np.frombuffer(record, dtype=np.uint8).astype(np.int64)
    return {"raw": record, "tokens": tokens + rng.integers(0, 3, size=len(tokens))}


def tensorflow_imported(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """1 when the process running it has imported TensorFlow, else 0."""
    return np.int64("tensorflow" in sys.modules)


def fail_at_index(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Raises ValueError on record FAILING_INDEX."""
    if int(record[0]) == FAILING_INDEX:
        msg = f"bad record {FAILING_INDEX}"
        raise ValueError(msg)
    return record


def kill_self_at_index(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """SIGKILLs its own process on record FAILING_INDEX (a crashed worker)."""
    if int(record[0]) == FAILING_INDEX:
        os.kill(os.getpid(), signal.SIGKILL)
    return record


def stall_at_index(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sleeps for an hour on record FAILING_INDEX (a stalled worker process)."""
    if int(record[0]) == FAILING_INDEX:
        time.sleep(3600)
    return record


RELEASE = threading.Event()


def wait_at_index(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Blocks on record FAILING_INDEX until RELEASE is set (a stalled worker thread)."""
    if int(record[0]) == FAILING_INDEX:
        RELEASE.wait(60)
    return record


def slow(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Takes a few milliseconds per record, so that a stream stays busy for a while."""
    time.sleep(0.002)
    return record


class CountingSource:
    """A source with `read_batch`: records its calls (per process)."""

    def __init__(self, num_records: int) -> None:
        self.data = np.arange(num_records * 2, dtype=np.int32).reshape(num_records, 2)
        self.batch_calls: list[list[int]] = []
        self.item_calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> np.ndarray:
        self.item_calls += 1
        return self.data[index]

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        self.batch_calls.append(indices.tolist())
        return self.data[indices]


def _rebuild_only_in_parent(data: np.ndarray, pid: int) -> np.ndarray:
    if os.getpid() != pid:
        msg = "this source cannot be opened in a worker"
        raise RuntimeError(msg)
    return data


class ParentOnlySource(CountingSource):
    """Pickles fine, but unpickling it in a worker process raises RuntimeError."""

    def __reduce__(self) -> tuple[object, tuple[np.ndarray, int]]:
        return _rebuild_only_in_parent, (self.data, os.getpid())


class BadRecordSource:
    """Records ``[i, 10 * i]`` (int64); reading an index in `bad` always raises ValueError.

    With `batched`, it also reads whole batches (``read_batch``), which raise when the
    batch holds a bad index: the batched path of the bad-record policy.
    """

    def __init__(self, num_records: int, bad: frozenset[int] | set[int], *, batched: bool = False):
        self.num_records = num_records
        self.bad = frozenset(bad)
        if batched:
            self.read_batch = self._read_batch

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> np.ndarray:
        if index in self.bad:
            msg = f"record {index} is corrupt"
            raise ValueError(msg)
        return np.array([index, 10 * index], dtype=np.int64)

    def _read_batch(self, indices: np.ndarray) -> np.ndarray:
        return np.stack([self[int(i)] for i in indices])


def placeholder(record_index: int, epoch: int, error: Exception) -> np.ndarray:
    """A bad-record policy: a record of -1s, with the failing index (a mask the model skips)."""
    return np.array([-1, record_index], dtype=np.int64)


def slow_augment(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`augment` taking 20 ms per record: a Dask cluster's batch tasks stay in flight."""
    time.sleep(0.02)
    return augment(record, rng)


class Marked:
    """`augment`, leaving one empty file in `directory` per record it makes: the records
    made so far, counted across threads and worker processes."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        name = f"{os.getpid()}-{threading.get_ident()}-{time.perf_counter_ns()}"
        with open(os.path.join(self.directory, name), "x"):
            pass
        return augment(record, rng)


#: What `flip_workers` cycles through, two batches each (`Tuning(decide=...)`).
FLIPS = (("thread", 2), ("inline", 0), ("process", 2), ("thread", 3))


def flip_workers(batches: int) -> tuple[str, int]:
    """A `Tuning.decide` that changes the worker kind or count every two batches."""
    return FLIPS[batches // 2 % len(FLIPS)]


#: The windows `flip_workers_and_windows` cycles through, three batches each.
WINDOWS = (1, 6, 2, 9)


def flip_workers_and_windows(batches: int) -> tuple[str, int, int]:
    """`flip_workers`, the window of the workers changing every three batches too."""
    kind, count = flip_workers(batches)
    return kind, count, WINDOWS[batches // 3 % len(WINDOWS)]
