"""ResumableLoader against the pipelines people use today, side by side in one run.

    python benchmarks/bench_loader.py [--quick] [--repeats 3] [--replay-epoch 5]

Prints three tables (rich):

(a) Throughput, records/s, one shuffled epoch of 100,000 CIFAR-sized records
    (3x32x32 uint8 image + int64 label), batch 128: resumeloader (``for batch in
    loader`` and ``dataset()`` + ``advance()`` in a ``tf.function`` loop), plain
    tf.data (``from_tensor_slices.shuffle(N).batch(128).prefetch(AUTOTUNE)``), the
    naive split pipeline (README, "Why"), grain 0.2.18 (``MapDataset`` and ``DataLoader``
    with 0 workers) and a NumPy permutation + fancy-index reference. Each contender is
    timed over the whole epoch (the slow per-record pipelines, the naive split and
    grain's DataLoader, over their first 20,000 records), the best of `--repeats`
    rounds, the rounds interleaved so that
    the machine's load hits every contender alike. The consumer only touches each
    batch, so the input pipeline is all that is measured.
(b) Restore to first batch at epoch 50 of 10**6 records, for several positions (and
    at epochs 1,000 and 10**6): ``set_state`` or ``tf.train.Checkpoint.read``, then
    the first batch of ``for batch in loader``; median and fastest of 9 interleaved
    rounds. Against the O(k) replays, one run each at `--replay-epoch` (default 5,
    as 50 takes minutes): re-running ``random.Random(seed).shuffle`` epoch + 1 times
    and ``Dataset.skip(k)`` on a shuffled, repeated tf.data pipeline. One row restores
    a new loader and takes the first batch of ``loader.dataset()`` (what Keras does),
    which includes building the tf.data pipeline.
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

RestoreRow = tuple[str, float, float]  # (method, median seconds, fastest seconds)


def _timed(work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def restore_times(num_records: int, epoch: int, workdir: Path, rounds: int) -> list[RestoreRow]:
    """Seconds from restoring to holding the first batch, at several positions.

    The positions are measured in interleaved rounds (load spikes hit all alike);
    each row gives the median and the fastest of `rounds`.
    """
    source = np.arange(num_records, dtype=np.int64)
    loader = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
    next(iter(loader))  # warm up tf.data
    state = loader.get_state()
    middle = num_records // 2
    positions = {
        f"set_state, epoch {epoch}, start of epoch": (epoch, 0),
        f"set_state, epoch {epoch}, middle of epoch": (epoch, middle),
        f"set_state, epoch {epoch}, last batch of epoch": (epoch, num_records - BATCH),
        f"set_state, epoch {epoch * 20:,}, middle of epoch": (epoch * 20, middle),
        f"set_state, epoch {10**6:,}, middle of epoch": (10**6, middle),
    }
    work: dict[str, Callable[[], Any]] = {}
    for label, (at_epoch, offset) in positions.items():
        target = dict(state, epoch=at_epoch, offset=offset)
        work[label] = lambda target=target: (loader.set_state(target), next(iter(loader)))
    loader.set_state(dict(state, epoch=epoch, offset=middle))
    checkpoint = tf.train.Checkpoint(loader=loader)
    path = checkpoint.write(str(workdir / "restore"))
    work[f"tf.train.Checkpoint.read, epoch {epoch}, middle"] = lambda: (
        checkpoint.read(path),
        next(iter(loader)),
    )

    def fresh() -> None:
        new = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
        tf.train.Checkpoint(loader=new).read(path)
        next(iter(new))

    work[f"new loader + Checkpoint.read, epoch {epoch}, middle"] = fresh

    def fresh_dataset() -> None:
        new = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
        tf.train.Checkpoint(loader=new).read(path)
        next(iter(new.dataset()))

    work[f"new loader + Checkpoint.read, first batch of dataset(), epoch {epoch}"] = fresh_dataset
    times: dict[str, list[float]] = {label: [] for label in work}
    for _ in range(rounds):
        for label, run in work.items():
            times[label].append(_timed(run))
    return [(f"resumeloader {label}", statistics.median(t), min(t)) for label, t in times.items()]


def replay_times(num_records: int, epoch: int) -> list[RestoreRow]:
    """The first batch in the middle of `epoch` by replaying the order (one run each)."""

    def shuffle_replay() -> None:
        rng = random.Random(SEED)
        order = list(range(num_records))
        for _ in range(epoch + 1):
            rng.shuffle(order)
        assert len(order[num_records // 2 : num_records // 2 + BATCH]) == BATCH

    ds = tf.data.Dataset.range(num_records).shuffle(num_records, seed=SEED).repeat()
    skip = (epoch * num_records + num_records // 2) // BATCH
    rows = []
    seconds = _timed(shuffle_replay)
    rows.append(
        (f"random.Random(seed).shuffle x{epoch + 1}, epoch {epoch}, middle", seconds, seconds)
    )
    seconds = _timed(lambda: next(iter(ds.batch(BATCH).skip(skip))))
    rows.append(
        (f"tf.data shuffle(N).repeat().batch().skip({skip:,}), epoch {epoch}", seconds, seconds)
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
    state = json.dumps(loader.get_state(), sort_keys=True, separators=(",", ":"))
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


def _print_throughput(console: Console, records: int, slow: int, repeats: int) -> None:
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


def _print_restore(console: Console, rounds: int, replay_epoch: int, workdir: Path) -> None:
    table = Table(title=f"(b) restore to first batch, {10**6:,} records, batch {BATCH}")
    table.add_column("method")
    table.add_column(f"median of {rounds}", justify="right")
    table.add_column("fastest", justify="right")
    table.add_column("median vs set_state epoch 50 middle", justify="right")
    rows = restore_times(10**6, 50, workdir, rounds)
    if replay_epoch >= 0:
        rows += replay_times(10**6, replay_epoch)
    ours = rows[1][1]
    for name, median, fastest in rows:
        table.add_row(name, _ms(median), _ms(fastest), f"{median / ours:,.1f}x")
    console.print(table)


def _print_sizes(console: Console, workdir: Path) -> None:
    table = Table(title="(c) checkpoint size on disk")
    for column in ("what", "bytes", "save time", "vs resumeloader checkpoint"):
        table.add_column(column, justify="left" if column == "what" else "right")
    rows = checkpoint_sizes(10**6, workdir)
    ours = rows[0][1]
    for name, size, seconds in rows:
        table.add_row(name, f"{size:,}", _ms(seconds) if seconds else "-", f"{size / ours:,.1f}x")
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    parser.add_argument("--repeats", type=int, default=3, help="throughput rounds (best kept)")
    parser.add_argument(
        "--replay-epoch",
        type=int,
        default=5,
        help="epoch the O(k) replays run to (one run each; 50 takes minutes; -1 skips them)",
    )
    parser.add_argument("--sections", default="abc", help="which tables to produce, e.g. 'b'")
    args = parser.parse_args(argv)
    records, slow, repeats, rounds = 100_000, 20_000, args.repeats, 9
    if args.quick:
        records, slow, repeats, rounds = 20_000, 5_000, 1, 3
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="bench_loader_"))
    load = os.getloadavg()[0]
    if "a" in args.sections:
        _print_throughput(console, records, slow, repeats)
    if "b" in args.sections:
        _print_restore(console, rounds, args.replay_epoch, workdir)
    if "c" in args.sections:
        _print_sizes(console, workdir)
    machine = {"tensorflow": tf.__version__, "cpus": os.cpu_count()}
    machine["load average, start and end"] = [round(load, 1), round(os.getloadavg()[0], 1)]
    console.print(json.dumps(machine))


if __name__ == "__main__":
    main()
