"""Pipelines shared by the loader tests, the restore-bug suite and bench_loader.

* `expected_batches`: the uninterrupted stream of record ids, computed from the
  `IndexSampler` alone (no TensorFlow), the reference every resumed run must equal.
* `run_case`: a consumer loop over ``loader.dataset()`` followed by a TF ``map`` (or
  over ``for batch in loader``) that advances the loader after each step and writes a
  ``tf.train.Checkpoint`` every `checkpoint_every` steps, crashes, restores from the
  last checkpoint and finishes, like a real training job.
* `NaiveSplitPipeline`: the common workaround of the README's "Why" (a checkpointed
  iterator over a pure-TF index dataset fed through ``from_generator`` + ``map``
  (``py_function``) + ``batch`` + ``prefetch``), which loses records on restore.

Kept importable without pytest so that a subprocess can run the same grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import resumeloader

AUTOTUNE = tf.data.AUTOTUNE

# Interruption points of the restore grid: (name, steps consumed before the crash
# as a function of batches per epoch and number of epochs).
INTERRUPTIONS = {
    "mid-epoch": lambda per_epoch, epochs: per_epoch // 2 + 1,
    "epoch-boundary": lambda per_epoch, epochs: per_epoch,
    "last-batch": lambda per_epoch, epochs: per_epoch * epochs - 1,
    "exhausted": lambda per_epoch, epochs: per_epoch * epochs,
}


def expected_batches(
    num_records: int, *, seed: int, batch_size: int, num_epochs: int, shuffle: bool = True
) -> list[list[int]]:
    """Record ids of every batch of an uninterrupted run, from the sampler alone."""
    sampler = resumeloader.IndexSampler(num_records, seed=seed, shuffle=shuffle)
    batches = []
    for epoch in range(num_epochs):
        order = sampler.epoch_indices(epoch, 0, num_records).tolist()
        batches += [order[i : i + batch_size] for i in range(0, num_records, batch_size)]
    return batches


class _Records:
    """A random-access source that is not an array: read record by record."""

    def __init__(self, records: np.ndarray) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.records[index]


@dataclasses.dataclass(frozen=True)
class GridCase:
    """One point of the restore grid."""

    batch_size: int
    prefetch: int | None
    parallel_calls: int
    checkpoint_every: int
    interruption: str
    fresh_loader: bool
    num_records: int = 23
    num_epochs: int = 2
    seed: int = 2024
    # "dataset": dataset() + TF map + advance(); "for-loop": `for batch in loader`
    # (its own prefetch thread; parallel_calls unused).
    consumer: str = "dataset"
    # "records": a plain random-access source (the generic from_generator path);
    # "array": a NumPy array (in-memory arrays are gathered inside tf.data).
    source: str = "records"

    @property
    def id(self) -> str:
        prefetch = {None: "none", AUTOTUNE: "auto"}.get(self.prefetch, str(self.prefetch))
        calls = "auto" if self.parallel_calls == AUTOTUNE else str(self.parallel_calls)
        target = "fresh" if self.fresh_loader else "same"
        how = f"map_{calls}" if self.consumer == "dataset" else "for-loop"
        return (
            f"{self.source}-bs{self.batch_size}-prefetch_{prefetch}-{how}"
            f"-ckpt_{self.checkpoint_every}-{self.interruption}-{target}"
        )

    def loader(self) -> resumeloader.ResumableLoader:
        records = np.arange(self.num_records, dtype=np.int32)
        return resumeloader.ResumableLoader(
            records if self.source == "array" else _Records(records),
            batch_size=self.batch_size,
            seed=self.seed,
            num_epochs=self.num_epochs,
            prefetch=self.prefetch,
            with_metadata=True,
        )


def grid(
    batch_sizes: tuple[int, ...] = (1, 4, 7),
    prefetches: tuple[int | None, ...] = (None, 1, 2, AUTOTUNE),
    parallel_calls: tuple[int, ...] = (1, AUTOTUNE),
    interruptions: tuple[str, ...] = tuple(INTERRUPTIONS),
    checkpoint_every: tuple[int, ...] = (1, 3),
    points_per_pipeline: int = 2,
) -> list[GridCase]:
    """Every (batch size, prefetch, parallel calls) pipeline, each interrupted at
    `points_per_pipeline` of the interruption points.

    The interruption points, the checkpoint cadence and the restore target (same or
    fresh loader) rotate like a Latin square over the pipelines, so every pair of
    values of any two axes occurs (checked by a test) without the full product's cost.
    """
    targets = list(itertools.product(checkpoint_every, (False, True)))
    pipelines = list(itertools.product(batch_sizes, prefetches, parallel_calls))
    step = max(1, len(interruptions) // points_per_pipeline)
    cases = []
    for p, (batch_size, prefetch, calls) in enumerate(pipelines):
        for k in range(points_per_pipeline):
            # p // 2 shifts the points between the two parallel_calls of a pipeline.
            i = (p + p // 2 + k * step) % len(interruptions)
            every, fresh = targets[(p + k) % len(targets)]
            case = GridCase(batch_size, prefetch, calls, every, interruptions[i], fresh)
            cases.append(case)
    return cases


def array_grid() -> list[GridCase]:
    """An array source (batches gathered inside tf.data) at every interruption point.

    Building that pipeline costs ~0.5 s, so it gets 8 cases: a two-level orthogonal
    array over prefetch (none, AUTOTUNE), downstream map (1, AUTOTUNE), cadence (1, 3)
    and restore target (same, fresh), then its complement; every pair of values of
    any two axes, interruption point included, occurs.
    """
    base = [(0, 0, 0, 0), (0, 1, 1, 0), (1, 0, 1, 0), (1, 1, 0, 0)]
    rows = base + [tuple(1 - level for level in row) for row in base]
    interruptions = list(INTERRUPTIONS)
    return [
        GridCase(
            7,
            (None, AUTOTUNE)[prefetch],
            (1, AUTOTUNE)[calls],
            (1, 3)[every],
            interruptions[k % 4],
            bool(fresh),
            source="array",
        )
        for k, (prefetch, calls, every, fresh) in enumerate(rows)
    ]


def loop_grid() -> list[GridCase]:
    """`for batch in loader` (eager prefetch thread) at every prefetch and interruption."""
    return [
        GridCase(4, prefetch, 1, every, interruption, fresh, consumer="for-loop")
        for prefetch in (None, 1, 2, AUTOTUNE)
        for interruption in INTERRUPTIONS
        for every, fresh in [(1, prefetch in (None, 2)), (3, prefetch in (1, AUTOTUNE))]
    ]


def _ids_dataset(loader: resumeloader.ResumableLoader, parallel_calls: int) -> tf.data.Dataset:
    # A TF map after the loader, as a real pipeline would have (parse, cast, augment).
    return loader.dataset().map(
        lambda data, meta: meta["index"] + 0 * tf.cast(data, tf.int64),
        num_parallel_calls=parallel_calls,
    )


def _train(
    loader: resumeloader.ResumableLoader,
    checkpoint: tf.train.Checkpoint,
    case: GridCase,
    path: Path,
    *,
    steps: int | None,
    first_step: int,
    checkpoint_every: int | None,
) -> tuple[list[list[int]], str | None]:
    """Consumes `steps` batches (all when None), checkpointing every `checkpoint_every`."""
    seen: list[list[int]] = []
    saved = None
    batches: Iterator[Any]
    if case.consumer == "for-loop":
        batches = (meta["index"] for _, meta in loader)  # advances as it hands out
    else:
        batches = iter(_ids_dataset(loader, case.parallel_calls))
    if steps is not None:
        batches = itertools.islice(batches, steps)
    for step, ids in enumerate(batches, start=first_step + 1):
        seen.append(ids.numpy().tolist())
        if case.consumer == "dataset":
            loader.advance()
        if checkpoint_every and step % checkpoint_every == 0:
            saved = checkpoint.write(str(path / f"ckpt-{step}"))
    return seen, saved


def run_case(case: GridCase, workdir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """Trains, crashes, restores and finishes; returns (expected, observed) batch ids.

    The crash happens after the case's interruption step; the run resumes from the
    last checkpoint written, so the observed stream is the batches consumed up to
    that checkpoint followed by everything consumed after the restore.
    """
    expected = expected_batches(
        case.num_records, seed=case.seed, batch_size=case.batch_size, num_epochs=case.num_epochs
    )
    per_epoch = len(expected) // case.num_epochs
    crash_after = INTERRUPTIONS[case.interruption](per_epoch, case.num_epochs)
    loader = case.loader()
    checkpoint = tf.train.Checkpoint(loader=loader)
    initial = checkpoint.write(str(workdir / "ckpt-0"))
    before, saved = _train(
        loader,
        checkpoint,
        case,
        workdir,
        steps=crash_after,
        first_step=0,
        checkpoint_every=case.checkpoint_every,
    )
    saved = saved or initial
    restored_step = int(saved.rsplit("-", 1)[1])
    if case.fresh_loader:
        loader = case.loader()
        checkpoint = tf.train.Checkpoint(loader=loader)
    checkpoint.read(saved).assert_consumed()
    # No second crash: the resumed run needs no checkpoints (they cost ~5 ms each).
    after, _ = _train(
        loader,
        checkpoint,
        case,
        workdir,
        steps=None,
        first_step=restored_step,
        checkpoint_every=None,
    )
    return expected, before[:restored_step] + after


class NaiveSplitPipeline:
    """The split-pipeline workaround: checkpoint an index iterator, feed it via a generator.

    The index dataset is pure TF, so its iterator checkpoints; the generator, the
    ``py_function`` map, ``batch`` and ``prefetch`` read ahead of what the training
    step consumed, so the saved index position is ahead of the consumed one.
    """

    def __init__(self, num_records: int, *, seed: int, batch_size: int, prefetch: int | None):
        self.num_records = num_records
        self.seed = seed
        self.batch_size = batch_size
        self.prefetch = prefetch
        index_ds = tf.data.Dataset.range(num_records).shuffle(num_records, seed=seed).repeat()
        self.index_iterator = iter(index_ds)
        self.checkpoint = tf.train.Checkpoint(iterator=self.index_iterator)

    def reference(self, count: int) -> list[int]:
        """The first `count` ids of the uninterrupted index stream."""
        fresh = NaiveSplitPipeline(
            self.num_records, seed=self.seed, batch_size=self.batch_size, prefetch=self.prefetch
        )
        return [int(next(fresh.index_iterator)) for _ in range(count)]

    def dataset(self) -> tf.data.Dataset:
        """Batches of record ids read through from_generator + py_function + batch."""
        iterator = self.index_iterator
        ds = tf.data.Dataset.from_generator(
            lambda: (yield from iterator), output_signature=tf.TensorSpec((), tf.int64)
        )
        ds = ds.map(lambda i: tf.py_function(lambda x: x, [i], tf.int64))
        ds = ds.batch(self.batch_size)
        if self.prefetch:
            ds = ds.prefetch(self.prefetch)
        return ds


def naive_records_lost(
    workdir: Path,
    *,
    num_records: int = 50,
    batch_size: int = 1,
    prefetch: int | None = AUTOTUNE,
    steps: int = 5,
    seed: int = 0,
    step_seconds: float = 0.0,
) -> int:
    """Consumes `steps` batches of the naive pipeline, saves, restores into a fresh one.

    Each step takes `step_seconds` (a stand-in for the training step, during which
    tf.data keeps reading ahead). Returns how many records of the uninterrupted
    stream the restored run skips: the distance between the consumed position and
    the one the checkpoint resumes at.
    """
    pipeline = NaiveSplitPipeline(num_records, seed=seed, batch_size=batch_size, prefetch=prefetch)
    consumed: list[int] = []
    for batch in itertools.islice(pipeline.dataset(), steps):
        consumed += batch.numpy().tolist()
        time.sleep(step_seconds)
    path = pipeline.checkpoint.write(str(workdir / "naive"))
    restored = NaiveSplitPipeline(num_records, seed=seed, batch_size=batch_size, prefetch=prefetch)
    restored.checkpoint.read(path).assert_consumed()
    next_id = int(next(iter(restored.dataset())).numpy()[0])
    reference = pipeline.reference(num_records)
    assert reference[: len(consumed)] == consumed, "the naive pipeline reordered records"
    return reference.index(next_id) - len(consumed)
