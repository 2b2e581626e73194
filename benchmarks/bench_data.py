"""Real data: TFRecord, ArrayRecord, an image folder and token sequences, side by side.

    python benchmarks/bench_data.py [--quick] [--rounds 3]

Builds its datasets in a temporary directory: JPEG-encoded 64x64 ``tf.train.Example``
records (20,000; 4,000 with ``--quick``) in 8 TFRecord files and the same records in 8
ArrayRecord files (``group_size:1``), an image folder of JPEG files in 10 class folders
(5,000; 2,000), token sequences of length 5-200 (20,000; 4,000), and a TFRecord file of
1,000,000 small records for the restore and index measurements. Then, batch 128, one
shuffled epoch per contender, rounds interleaved, median records/s:

* TFRecord: ``TFRecordSource`` + ``tf_map(parse_example + decode_jpeg)`` against plain
  ``TFRecordDataset(files).shuffle(10_000).map(parse+decode, AUTOTUNE).batch(128)
  .prefetch(AUTOTUNE)`` and against the hand-written loader of today (an offset index
  and a ``map_fn`` that parses the proto and decodes the JPEG in Python, 2 thread
  workers);
* ArrayRecord: ``ArrayRecordSource`` + the same stage against grain 0.2.18 reading
  the same files with the same decode (``MapDataset`` and ``DataLoader`` with 0 and 2
  workers, ``ReadOptions(num_threads=0)`` as grain recommends on 2 cores);
* image folder: paths + ``tf_map(read_file + decode_jpeg)`` against
  ``Dataset.list_files(...).map(read+decode, AUTOTUNE).batch(128)``;
* tokens: ragged batches against ``from_tensor_slices(ragged).shuffle(N).ragged_batch``;
* restore to the first batch at epoch 50 of the 1,000,000-record TFRecord source
  (index built), median of 9; index build time and bytes per record.

The slow per-record contenders (the hand-written loader, grain) are timed over their
first 5,000 records (1,000 with ``--quick``) after 4 warm-up batches. Absolute numbers
depend on the machine and its load (printed); the ratios of one run are the result.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import io
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import _common
import _results
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

from resumeloader import Pipeline, ResumableLoader, Workers
from resumeloader.sources import ArrayRecordSource, TFRecordSource, tfrecord_index

BATCH = 128
SHARDS = 8
FEATURES = {
    "image": tf.io.FixedLenFeature((), tf.string),
    "label": tf.io.FixedLenFeature((), tf.int64),
}
AUTOTUNE = tf.data.AUTOTUNE


# -- data ----------------------------------------------------------------------------


def _jpeg(rng: np.random.Generator) -> bytes:
    ramp = np.linspace(0, 255, 64, dtype=np.float32)
    image = ramp[None, :, None] * 0.5 + ramp[:, None, None] * 0.3 + rng.normal(0, 8, (64, 64, 3))
    return tf.io.encode_jpeg(image.clip(0, 255).astype(np.uint8), quality=90).numpy()


def _example(jpeg: bytes, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def build_data(root: str, num_records: int, num_images: int, num_restore: int) -> dict[str, Any]:
    """Writes every dataset under `root`; returns their paths."""
    from array_record.python import array_record_module

    rng = np.random.default_rng(0)
    jpegs = [_jpeg(rng) for _ in range(64)]  # encoding is slow; records reuse 64 images
    tfrecords = [os.path.join(root, f"train-{i}-of-{SHARDS}.tfrecord") for i in range(SHARDS)]
    arrays = [os.path.join(root, f"train-{i}-of-{SHARDS}.array_record") for i in range(SHARDS)]
    writers = [tf.io.TFRecordWriter(path) for path in tfrecords]
    array_writers = [array_record_module.ArrayRecordWriter(p, "group_size:1") for p in arrays]
    for i in range(num_records):
        record = _example(jpegs[i % 64] + bytes([i % 251]), i % 10)  # distinct bytes
        writers[i % SHARDS].write(record)
        array_writers[i % SHARDS].write(record)
    for writer in (*writers, *array_writers):
        writer.close()
    folder = os.path.join(root, "images")
    paths = []
    for i in range(num_images):
        path = os.path.join(folder, f"class-{i % 10}", f"{i:06d}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(jpegs[i % 64])
        paths.append(path)
    restore = os.path.join(root, "restore.tfrecord")
    with tf.io.TFRecordWriter(restore) as writer:
        for i in range(num_restore):
            writer.write(i.to_bytes(8, "little"))
    lengths = rng.integers(5, 201, size=num_records)
    tokens = [rng.integers(0, 32_000, size=n, dtype=np.int64) for n in lengths]
    return {
        "tfrecord": tfrecords,
        "array_record": arrays,
        "images": folder,
        "paths": paths,
        "restore": restore,
        "tokens": tokens,
    }


# -- the decode, in TensorFlow and in Python ----------------------------------------------


def parse_decode_batch(batch: tf.Tensor, seeds: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """resumeloader's stage: parse a batch of Examples, decode each JPEG."""
    features = tf.io.parse_example(batch, FEATURES)
    images = tf.map_fn(
        lambda jpeg: tf.io.decode_jpeg(jpeg, channels=3),
        features["image"],
        fn_output_signature=tf.TensorSpec((64, 64, 3), tf.uint8),
        parallel_iterations=16,
    )
    return images, features["label"]


def parse_decode_one(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """plain tf.data's map: the same work for one record."""
    features = tf.io.parse_single_example(record, FEATURES)
    return tf.io.decode_jpeg(features["image"], channels=3), features["label"]


def python_parse_decode(record: bytes, rng: Any = None) -> tuple[np.ndarray, np.int64]:
    """The hand-written loader's (and grain's) decode: protobuf + PIL, in Python."""
    from PIL import Image
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(record)
    feature = example.features.feature
    image = Image.open(io.BytesIO(feature["image"].bytes_list.value[0])).convert("RGB")
    return np.asarray(image), np.int64(feature["label"].int64_list.value[0])


class HandIndexedTFRecord:
    """Today's hand-written random access: an offset index, one open file per read."""

    def __init__(self, paths: list[str]) -> None:
        self.items: list[tuple[str, int, int]] = []
        for path in paths:
            with open(path, "rb") as f:
                offset = 0
                while header := f.read(12):
                    length = int.from_bytes(header[:8], "little")
                    self.items.append((path, offset + 12, length))
                    offset += length + 16
                    f.seek(offset)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> bytes:
        path, offset, length = self.items[index]
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)


def _grain_decode() -> Any:
    import grain.python as grain

    class Decode(grain.MapTransform):
        def map(self, element: bytes) -> tuple[np.ndarray, np.int64]:
            return python_parse_decode(element)

    return Decode()


# -- contenders ------------------------------------------------------------------------


def _resumeloader(source: Any, stage: Callable[..., Any], way: str, index_dir: str) -> Iterable:
    pipeline = Pipeline(source, seed=0).shuffle().batch(BATCH).tf_map(stage)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    return loader.dataset() if way == "dataset" else loader


def contenders(data: dict[str, Any], root: str, slow_limit: int) -> dict[str, tuple]:
    """name -> (section, make iterable, record limit or None)."""
    import grain.python as grain

    index_dir = os.path.join(root, "index")
    tfrecords, arrays = data["tfrecord"], data["array_record"]
    tfr = lambda: TFRecordSource(tfrecords, index_dir=index_dir)  # noqa: E731
    arr = lambda: ArrayRecordSource(arrays)  # noqa: E731
    pattern = os.path.join(data["images"], "*", "*.jpg")
    labels = [int(os.path.basename(os.path.dirname(p)).split("-")[1]) for p in data["paths"]]

    def read_decode_batch(batch: Any, seeds: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        images = tf.map_fn(
            lambda path: tf.io.decode_jpeg(tf.io.read_file(path), channels=3),
            batch["path"],
            fn_output_signature=tf.TensorSpec((64, 64, 3), tf.uint8),
            parallel_iterations=16,
        )
        return images, batch["label"]

    def read_decode_path(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        label = tf.strings.to_number(
            tf.strings.split(tf.strings.split(path, os.sep)[-2], "-")[1], tf.int64
        )
        return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label

    def grain_loader(workers: int) -> Any:
        _common.grain_flags()
        source = grain.ArrayRecordDataSource(arrays)
        sampler = grain.IndexSampler(
            len(source), shard_options=grain.NoSharding(), shuffle=True, num_epochs=1, seed=0
        )
        return grain.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[_grain_decode(), grain.Batch(BATCH)],
            worker_count=workers,
            read_options=grain.ReadOptions(num_threads=0),
        )

    def grain_map_dataset() -> Any:
        ds = grain.MapDataset.source(grain.ArrayRecordDataSource(arrays)).shuffle(seed=0)
        return ds.map(python_parse_decode).batch(BATCH)

    tokens = data["tokens"]
    return {
        "resumeloader: TFRecordSource + tf_map, dataset()": (
            "tfrecord",
            lambda: _resumeloader(tfr(), parse_decode_batch, "dataset", index_dir),
            None,
        ),
        "resumeloader: TFRecordSource + tf_map, for batch in loader": (
            "tfrecord",
            lambda: _resumeloader(tfr(), parse_decode_batch, "loop", index_dir),
            None,
        ),
        "plain TFRecordDataset.shuffle(10k).map(parse+decode, AUTOTUNE).batch": (
            "tfrecord",
            lambda: (
                tf.data.TFRecordDataset(tfrecords)
                .shuffle(10_000)
                .map(parse_decode_one, num_parallel_calls=AUTOTUNE)
                .batch(BATCH)
                .prefetch(AUTOTUNE)
            ),
            None,
        ),
        "hand-written: offset index + Python parse/decode map_fn, 2 threads": (
            "tfrecord",
            lambda: ResumableLoader(
                HandIndexedTFRecord(tfrecords),
                batch_size=BATCH,
                seed=0,
                num_epochs=1,
                map_fn=python_parse_decode,
                workers=Workers(2, kind="thread"),
            ),
            slow_limit,
        ),
        "resumeloader: ArrayRecordSource + tf_map, dataset()": (
            "array_record",
            lambda: _resumeloader(arr(), parse_decode_batch, "dataset", index_dir),
            None,
        ),
        "grain MapDataset.source(ArrayRecord).shuffle.map(decode).batch": (
            "array_record",
            grain_map_dataset,
            slow_limit,
        ),
        "grain DataLoader, 0 workers, ReadOptions(num_threads=0)": (
            "array_record",
            lambda: grain_loader(0),
            slow_limit,
        ),
        "grain DataLoader, 2 workers, ReadOptions(num_threads=0)": (
            "array_record",
            lambda: grain_loader(2),
            slow_limit,
        ),
        "resumeloader: image paths + tf_map(read_file + decode), dataset()": (
            "images",
            lambda: _resumeloader(
                {"path": data["paths"], "label": labels}, read_decode_batch, "dataset", index_dir
            ),
            None,
        ),
        "tf.data list_files(shuffle).map(read+decode, AUTOTUNE).batch": (
            "images",
            lambda: (
                tf.data.Dataset.list_files(pattern, shuffle=True, seed=0)
                .map(read_decode_path, num_parallel_calls=AUTOTUNE)
                .batch(BATCH)
                .prefetch(AUTOTUNE)
            ),
            None,
        ),
        "resumeloader: token arrays -> ragged batches, dataset()": (
            "tokens",
            lambda: ResumableLoader(tokens, batch_size=BATCH, seed=0, num_epochs=1).dataset(),
            None,
        ),
        "tf.data from_tensor_slices(ragged).shuffle(N).ragged_batch": (
            "tokens",
            lambda: (
                tf.data.Dataset.from_tensor_slices(tf.ragged.constant(tokens))
                .shuffle(len(tokens))
                .ragged_batch(BATCH)
                .prefetch(AUTOTUNE)
            ),
            None,
        ),
    }


def _size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(first.shape[0])


def throughput(make: Callable[[], Iterable], limit: int | None) -> float:
    """Records/s over an epoch (or `limit` records) after 4 warm-up batches (CPU per
    record measured by `_common.Meter`)."""
    iterator = iter(make())
    for _ in range(4):
        next(iterator)
    records, batches = 0, 0
    with _common.Meter() as meter:
        start = time.perf_counter()
        for batch in iterator:
            records += _size(batch)
            batches += 1
            if limit is not None and records >= limit:
                break
        seconds = time.perf_counter() - start
        meter.done(batches, records)
    return records / seconds


# -- restore and index ------------------------------------------------------------------


def restore_latency(path: str, index_dir: str, rounds: int) -> dict[str, float]:
    """ms from restoring a state at epoch 50 (mid-epoch) to holding the first batch."""

    def parse(batch: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
        return tf.io.decode_raw(batch, tf.int64)

    def loader(stage: bool) -> ResumableLoader:
        pipeline = Pipeline(TFRecordSource(path, index_dir=index_dir), seed=0).shuffle()
        pipeline = pipeline.batch(BATCH)
        return ResumableLoader.from_pipeline(pipeline.tf_map(parse) if stage else pipeline)

    reference = loader(False)
    num = reference.num_records
    state = dict(reference.get_state(), epoch=50, offset=num // 2 // BATCH * BATCH)
    cases = {
        "new TFRecordSource + loader, set_state, first batch of `for batch in loader`": lambda: (
            next(iter(_restored(loader(False), state)))
        ),
        "set_state, first batch of `for batch in loader`": lambda: next(
            iter(_restored(reference, state))
        ),
        "with a tf_map stage: set_state, first batch of `for batch in loader`": lambda: next(
            iter(_restored(staged, state))
        ),
        "with a tf_map stage: set_state, first batch of dataset()": lambda: next(
            iter(_restored(staged, state).dataset())
        ),
    }
    staged = loader(True)
    next(iter(staged.dataset()))  # traced once, as a training job would have done
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            start = time.perf_counter()
            case()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def _restored(loader: ResumableLoader, state: dict[str, Any]) -> ResumableLoader:
    loader.set_state(state)
    return loader


def index_costs(paths: list[str], index_dir: str) -> dict[str, float]:
    """Cold build and warm load of the indexes of `paths`."""
    start = time.perf_counter()
    source = TFRecordSource(paths, index_dir=index_dir)
    build = time.perf_counter() - start
    start = time.perf_counter()
    TFRecordSource(paths, index_dir=index_dir)
    load = time.perf_counter() - start
    stored = sum(os.path.getsize(tfrecord_index.cache_path(p, index_dir)) for p in paths)
    data = sum(os.path.getsize(p) for p in paths)
    return {
        "records": len(source),
        "megabytes": data / 1e6,
        "build_s": build,
        "load_ms": load * 1e3,
        "bytes_per_record": stored / len(source),
        "build_s_per_gb": build / (data / 1e9),
    }


# -- report -------------------------------------------------------------------------------


def run(quick: bool, rounds: int) -> Report:
    """The tables and the targets of issue 11."""
    rounds = 1 if quick else rounds
    with tempfile.TemporaryDirectory(prefix="bench-data-") as root:
        began = time.perf_counter()
        data = build_data(root, 4_000 if quick else 20_000, 2_000 if quick else 5_000, 1_000_000)
        print(f"Datasets written in {time.perf_counter() - began:.0f} s.", file=sys.stderr)
        index = index_costs(data["tfrecord"], os.path.join(root, "index"))
        restore_index = index_costs([data["restore"]], os.path.join(root, "index"))
        table = contenders(data, root, 1_000 if quick else 5_000)
        start = _results.load_average()
        rates = _common.interleaved({
            name: lambda make=make, limit=limit: throughput(make, limit)
            for name, (_, make, limit) in table.items()
        }, rounds)
        throughput_load = start
        start = _results.load_average()
        latency = restore_latency(data["restore"], os.path.join(root, "index"), 9)
    return report(table, rates, latency, index, restore_index, (throughput_load, start), rounds)


def report(
    table: dict[str, tuple],
    rates: dict[str, float],
    latency: dict[str, float],
    index: dict[str, float],
    restore_index: dict[str, float],
    starts: tuple[list[float], list[float]],
    rounds: int,
) -> Report:
    names = list(table)
    ours = rates[names[0]]
    grain_best = max(rates[n] for n in names if n.startswith("grain"))
    first_batch = latency[
        "new TFRecordSource + loader, set_state, first batch of `for batch in loader`"
    ]
    item = "11, real data"
    grain_fastest = max((n for n in names if n.startswith("grain")), key=rates.__getitem__)
    targets = [
        Target("TFRecord + tf_map / plain TFRecordDataset", ours / rates[names[2]], 1.0,
               item=item, cpu_value=_common.cpu_ratio(names[0], names[2])),
        Target("TFRecord + tf_map / hand-written Python decode", ours / rates[names[3]], 3.0,
               item=item, cpu_value=_common.cpu_ratio(names[0], names[3])),
        Target("ArrayRecord + tf_map / grain's fastest", rates[names[4]] / grain_best, 1.5,
               item=item, cpu_value=_common.cpu_ratio(names[4], grain_fastest)),
        Target("image folder + tf_map / tf.data list_files", rates[names[8]] / rates[names[9]],
               0.9, item=item, cpu_value=_common.cpu_ratio(names[8], names[9])),
        Target("restore -> first batch, 1M-record TFRecord, epoch 50", first_batch, 50,
               unit=" ms", at_most=True, item=item),
    ]
    rows = Table(
        "throughput", "Real data: throughput", "bench_data.py",
        f"Batch {BATCH}, one shuffled epoch per contender (the slow per-record ones: their "
        f"first records), records/s, median of {rounds} interleaved round(s).",
        [Column("data", "data"), Column("pipeline", "pipeline"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column(),
         Column("vs_first", "vs first of its data", ".2f", "x")],
        note=f"TensorFlow {tf.__version__}",
    )
    firsts: dict[str, float] = {}
    for name, (section, _, _) in table.items():
        firsts.setdefault(section, rates[name])
        rows.add(data=section, pipeline=name, rate=rates[name], cpu_us=_common.cpu_us(name),
                 vs_first=rates[name] / firsts[section])
    rows.finish(starts[0])
    restore = Table(
        "restore", "Real data: restore at epoch 50 of 1,000,000 TFRecord records",
        "bench_data.py", "ms from `set_state` to holding the first batch, median of 9.",
        [Column("what", "what"), Column("ms", "ms", ".1f")],
    )
    for name, value in latency.items():
        restore.add(what=name, ms=value)
    restore.finish(starts[1])
    costs = Table(
        "index", "Real data: the TFRecord offset index", "bench_data.py", "",
        [Column("files", "files"), Column("records", "records", ",.0f"),
         Column("megabytes", "MB", ".0f"), Column("build_s", "build (cold)", ".2f", " s"),
         Column("build_s_per_gb", "build per GB", ".1f", " s"),
         Column("load_ms", "load", ".1f", " ms"),
         Column("bytes_per_record", "bytes/record", ".2f")],
    )
    for what, c in (("8 JPEG shards", index), ("1 file of 8-byte records", restore_index)):
        costs.add(files=what, **c)
    return Report([rows, restore, costs], targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller datasets, one round")
    parser.add_argument("--rounds", type=int, default=3)
    _common.add_json_option(parser)
    args = parser.parse_args()
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
