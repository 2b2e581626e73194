"""ResumableLoader against the pipelines people use today, side by side in one run.

    python benchmarks/bench_loader.py [--quick] [--repeats 3]

Prints three tables (rich):

(a) Throughput, records/s, one shuffled epoch of 100,000 CIFAR-sized records
    (3x32x32 uint8 image + int64 label), batch 128: resumeloader (``for batch in
    loader`` and ``dataset()`` + ``advance()`` in a ``tf.function`` loop), plain
    tf.data (``from_tensor_slices.shuffle(N).batch(128).prefetch(AUTOTUNE)``), the
    naive split pipeline of DESIGN.md, grain 0.2.18 (``MapDataset`` and ``DataLoader``
    with 0 workers) and a NumPy permutation + fancy-index reference. Each contender is
    timed over the whole epoch (the slow per-record pipelines over their first
    `--slow-records`), the best of `--repeats` rounds, the rounds interleaved so that
    the machine's load hits every contender alike. The consumer only touches each
    batch, so the input pipeline is all that is measured.
(b) Restore to first batch at epoch 50 of 10**6 records, for several positions in
    the epoch: ``set_state`` and ``tf.train.Checkpoint.read`` + first batch, against
    re-running ``random.Random(seed).shuffle`` epoch + 1 times and
    ``Dataset.skip(k)`` on a shuffled, repeated tf.data pipeline.
(c) Checkpoint size on disk: a loader checkpoint vs a tf.data iterator checkpoint of
    ``range(10**6).shuffle(10**6)``.

Absolute numbers depend on the machine and its load; the ratios, measured in the same
run, are the result.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from rich.console import Console
from rich.table import Table

import resumeloader

BATCH = 128
SEED = 0


# -- (a) throughput --------------------------------------------------------------------


class _RecordSource:
    """Per-record access to the arrays (what grain's sources and the naive pipeline read)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        return self.images[index], self.labels[index]


def _count(batches: Iterable[Any], limit: int | None = None) -> int:
    records = 0
    for batch in batches:
        records += int(batch[1].shape[0])
        if limit is not None and records >= limit:
            break
    return records


def _loader(images: np.ndarray, labels: np.ndarray) -> resumeloader.ResumableLoader:
    return resumeloader.ResumableLoader((images, labels), batch_size=BATCH, seed=SEED, num_epochs=1)


def _resumeloader_for(images: np.ndarray, labels: np.ndarray) -> Callable[[], int]:
    return lambda: _count(_loader(images, labels))


def _resumeloader_tf_function(images: np.ndarray, labels: np.ndarray) -> Callable[[], int]:
    loader = _loader(images, labels)
    start = loader.get_state()

    @tf.function
    def epoch(dataset: tf.data.Dataset) -> tf.Tensor:
        records = tf.constant(0, tf.int64)
        for _, batch_labels in dataset:
            records += tf.shape(batch_labels, out_type=tf.int64)[0]
            loader.advance()
        return records

    def run() -> int:
        loader.set_state(start)  # traced once: a training loop's steady state
        return int(epoch(loader.dataset()))

    return run


def _plain_tf_data(images: np.ndarray, labels: np.ndarray) -> Callable[[], int]:
    def run() -> int:
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shuffle(len(labels), seed=SEED).batch(BATCH).prefetch(tf.data.AUTOTUNE)
        return _count(ds)

    return run


def _naive_split(images: np.ndarray, labels: np.ndarray, limit: int) -> Callable[[], int]:
    def fetch(index: tf.Tensor) -> tuple[np.ndarray, np.int64]:
        i = int(index)
        return images[i], labels[i]

    def run() -> int:
        index_ds = tf.data.Dataset.range(len(labels)).shuffle(len(labels), seed=SEED)
        iterator = iter(index_ds)  # what the workaround checkpoints
        ds = tf.data.Dataset.from_generator(
            lambda: (yield from iterator), output_signature=tf.TensorSpec((), tf.int64)
        )
        ds = ds.map(
            lambda i: tf.py_function(fetch, [i], (tf.uint8, tf.int64)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)
        return _count(ds, limit)

    return run


def _grain_map_dataset(images: np.ndarray, labels: np.ndarray) -> Callable[[], int]:
    import grain

    source = _RecordSource(images, labels)
    return lambda: _count(grain.MapDataset.source(source).shuffle(seed=SEED).batch(BATCH))


def _grain_data_loader(images: np.ndarray, labels: np.ndarray, limit: int) -> Callable[[], int]:
    import grain

    def run() -> int:
        sampler = grain.samplers.IndexSampler(
            num_records=len(labels),
            shard_options=grain.sharding.NoSharding(),
            shuffle=True,
            num_epochs=1,
            seed=SEED,
        )
        loader = grain.DataLoader(
            data_source=_RecordSource(images, labels),
            sampler=sampler,
            operations=[grain.transforms.Batch(BATCH)],
            worker_count=0,
            # Measured fastest with 0 workers on this machine (0 > 1 > 16 read threads).
            read_options=grain.ReadOptions(num_threads=0, prefetch_buffer_size=1),
        )
        return _count(loader, limit)

    return run


def _numpy_reference(images: np.ndarray, labels: np.ndarray) -> Callable[[], int]:
    def run() -> int:
        order = np.random.default_rng(SEED).permutation(len(labels))
        records = 0
        for start in range(0, len(labels), BATCH):
            batch = order[start : start + BATCH]
            records += len((images[batch], labels[batch])[1])
        return records

    return run


def throughput(num_records: int, slow_records: int, repeats: int) -> list[tuple[str, float]]:
    """Records/s of every contender: the best of `repeats` interleaved rounds."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (num_records, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, num_records).astype(np.int64)
    contenders = {
        "resumeloader: for batch in loader": _resumeloader_for(images, labels),
        "resumeloader: dataset() + advance() in tf.function": _resumeloader_tf_function(
            images, labels
        ),
        "plain tf.data: from_tensor_slices.shuffle(N).batch": _plain_tf_data(images, labels),
        "naive split pipeline (from_generator + py_function)": _naive_split(
            images, labels, slow_records
        ),
        "grain MapDataset.source.shuffle.batch": _grain_map_dataset(images, labels),
        "grain DataLoader, 0 workers": _grain_data_loader(images, labels, slow_records),
        "NumPy permutation + fancy-index (reference)": _numpy_reference(images, labels),
    }
    best = dict.fromkeys(contenders, 0.0)
    for _ in range(repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            records = run()
            best[name] = max(best[name], records / (time.perf_counter() - start))
    return list(best.items())


# -- (b) restore to first batch --------------------------------------------------------


def _first_batch_after(restore: Callable[[], Any], loader: resumeloader.ResumableLoader) -> float:
    """Seconds from calling `restore` to holding the first batch (median of 5)."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        restore()
        next(iter(loader))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def restore_times(num_records: int, epoch: int, workdir: Path) -> list[tuple[str, float]]:
    """Restore-to-first-batch seconds for resumeloader at several positions, and replays."""
    rows = []
    source = np.arange(num_records, dtype=np.int64)
    loader = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
    next(iter(loader))  # warm up tf.data and the sampler's caches
    offsets = {"start": 0, "middle": num_records // 2, "last batch": num_records - BATCH}
    for label, offset in offsets.items():
        loader.set_state(dict(loader.get_state(), epoch=epoch, offset=offset))
        state = loader.get_state()
        seconds = _first_batch_after(lambda state=state: loader.set_state(state), loader)
        rows.append((f"resumeloader set_state, epoch {epoch}, {label} of epoch", seconds))
    for far_epoch in (epoch * 20, 10**6):
        loader.set_state(dict(loader.get_state(), epoch=far_epoch, offset=num_records // 2))
        state = loader.get_state()
        seconds = _first_batch_after(lambda state=state: loader.set_state(state), loader)
        rows.append((f"resumeloader set_state, epoch {far_epoch:,}, middle of epoch", seconds))
    loader.set_state(dict(loader.get_state(), epoch=epoch, offset=num_records // 2))
    checkpoint = tf.train.Checkpoint(loader=loader)
    path = checkpoint.write(str(workdir / "restore"))
    seconds = _first_batch_after(lambda: checkpoint.read(path), loader)
    rows.append((f"resumeloader tf.train.Checkpoint.read, epoch {epoch}, middle", seconds))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fresh = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
        tf.train.Checkpoint(loader=fresh).read(path)
        next(iter(fresh))
        times.append(time.perf_counter() - start)
    rows.append(
        (f"new ResumableLoader + Checkpoint.read, epoch {epoch}, middle", statistics.median(times))
    )

    start = time.perf_counter()
    rng = random.Random(SEED)
    order = list(range(num_records))
    for _ in range(epoch + 1):
        rng.shuffle(order)
    first = order[num_records // 2 : num_records // 2 + BATCH]
    rows.append((f"random.Random(seed).shuffle x{epoch + 1}, middle", time.perf_counter() - start))
    assert len(first) == BATCH

    start = time.perf_counter()
    ds = tf.data.Dataset.range(num_records).shuffle(num_records, seed=SEED).repeat()
    skip = (epoch * num_records + num_records // 2) // BATCH
    next(iter(ds.batch(BATCH).skip(skip)))
    rows.append(
        (f"tf.data shuffle(N).repeat().batch().skip({skip:,}), middle", time.perf_counter() - start)
    )
    return rows


# -- (c) checkpoint size ---------------------------------------------------------------


def _size(prefix: str) -> int:
    return sum(p.stat().st_size for p in Path(prefix).parent.glob(Path(prefix).name + "*"))


def checkpoint_sizes(num_records: int, workdir: Path) -> list[tuple[str, int, float]]:
    """(what, bytes on disk, save seconds) for a loader and a tf.data shuffle iterator."""
    loader = resumeloader.ResumableLoader(np.arange(num_records), batch_size=BATCH, seed=SEED)
    loader.advance(1000)
    rows = []
    start = time.perf_counter()
    path = tf.train.Checkpoint(loader=loader).write(str(workdir / "loader"))
    rows.append(
        ("resumeloader: tf.train.Checkpoint files", _size(path), time.perf_counter() - start)
    )
    state = resumeloader._state.to_json(loader.get_state())  # what the checkpoint holds
    rows.append(("resumeloader: get_state() as JSON text", len(state.encode()), 0.0))

    iterator = iter(tf.data.Dataset.range(num_records).shuffle(num_records, seed=SEED))
    for _ in range(1000):
        next(iterator)
    start = time.perf_counter()
    path = tf.train.Checkpoint(iterator=iterator).write(str(workdir / "tfdata"))
    rows.append(
        (
            f"tf.data iterator: range({num_records:,}).shuffle({num_records:,})",
            _size(path),
            time.perf_counter() - start,
        )
    )
    return rows


# -- report ----------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    parser.add_argument("--repeats", type=int, default=3, help="throughput rounds (best kept)")
    args = parser.parse_args(argv)
    records, slow, repeats, epoch = 100_000, 20_000, args.repeats, 50
    if args.quick:
        records, slow, repeats, epoch = 20_000, 5_000, 1, 5
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="bench_loader_"))

    rates = dict(throughput(records, slow, repeats))
    plain = rates["plain tf.data: from_tensor_slices.shuffle(N).batch"]
    grain_best = max(v for k, v in rates.items() if k.startswith("grain"))
    table = Table(
        title=f"(a) {records:,} records 3x32x32 uint8 + label, batch {BATCH}, "
        f"one shuffled epoch (best of {repeats})"
    )
    for column in ("pipeline", "records/s", "vs plain tf.data", "vs grain's fastest"):
        table.add_column(column, justify="left" if column == "pipeline" else "right")
    for name, rate in rates.items():
        table.add_row(name, f"{rate:,.0f}", f"{rate / plain:.2f}x", f"{rate / grain_best:.2f}x")
    console.print(table)

    table = Table(title=f"(b) restore to first batch, {10**6:,} records, batch {BATCH}")
    table.add_column("method")
    table.add_column("time", justify="right")
    table.add_column("vs resumeloader set_state (epoch 50, middle)", justify="right")
    rows = restore_times(10**6, epoch, workdir)
    ours = next(s for name, s in rows if "set_state" in name and "middle" in name)
    for name, seconds in rows:
        table.add_row(name, _ms(seconds), f"{seconds / ours:,.1f}x")
    console.print(table)

    table = Table(title="(c) checkpoint size on disk")
    for column in ("what", "bytes", "save time", "vs resumeloader checkpoint"):
        table.add_column(column, justify="left" if column == "what" else "right")
    rows_c = checkpoint_sizes(10**6, workdir)
    ours_bytes = rows_c[0][1]
    for name, size, seconds in rows_c:
        table.add_row(
            name, f"{size:,}", _ms(seconds) if seconds else "-", f"{size / ours_bytes:,.1f}x"
        )
    console.print(table)
    console.print(
        json.dumps(
            {"tensorflow": tf.__version__, "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
        )
    )


if __name__ == "__main__":
    main()
