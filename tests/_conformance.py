"""The resume-conformance registry: every kind of pipeline the library supports, one entry each.

Each entry builds a fresh loader; test_conformance.py runs every entry through
`resumeloader.testing.assert_resumes_identically` (restores through ``set_state`` with
a JSON round trip and through ``tf.train.Checkpoint`` into fresh loaders, at 0,
mid-epoch, the epoch boundary, the last batch and after exhaustion, each resumed a
second time). A new source, stage or delivery path is one more `register` call here.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable

import _objstore_fixtures
import _worker_fns
import numpy as np

from resumeloader import DaskOptions, Pipeline, ResumableLoader, Shard, Tuning, Workers
from resumeloader.sources import (
    ArrayRecordSource,
    FileSource,
    HuggingFaceSource,
    Storage,
    TFRecordSource,
)

REGISTRY: dict[str, Case] = {}


@dataclasses.dataclass(frozen=True)
class Case:
    """One registered pipeline: how to build it and where to break it."""

    make: Callable[[], ResumableLoader]
    num_steps: int
    break_points: tuple[int, ...] | None = None  # None: the helper's defaults
    needs: tuple[str, ...] = ()  # pytest fixtures that must be set up first (servers)


def register(
    name: str,
    num_steps: int,
    break_points: tuple[int, ...] | None = None,
    needs: tuple[str, ...] = (),
):
    """Decorator: registers a zero-argument loader factory under `name`."""

    def add(make: Callable[[], ResumableLoader]) -> Callable[[], ResumableLoader]:
        assert name not in REGISTRY, name
        REGISTRY[name] = Case(make, num_steps, break_points, needs)
        return make

    return add


_IMAGES = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)
_LABELS = np.arange(37, dtype=np.int64) % 5


class ListSource:
    """A random-access source that is not an array: read record by record."""

    def __init__(self, records: list[np.ndarray]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.records[index]


@register("array", num_steps=7)
def _array() -> ResumableLoader:
    return ResumableLoader(_IMAGES, batch_size=5, seed=1, num_epochs=2)


@register("array-map_fn", num_steps=7)
def _array_map() -> ResumableLoader:
    return ResumableLoader(_IMAGES, batch_size=5, seed=2, num_epochs=2, map_fn=_worker_fns.augment)


@register("dict-of-arrays-with-metadata", num_steps=7)
def _dict_metadata() -> ResumableLoader:
    data = {"image": _IMAGES, "label": _LABELS}
    return ResumableLoader(data, batch_size=5, seed=3, num_epochs=2, with_metadata=True)


@register("getitem-source-map_fn", num_steps=7)
def _getitem() -> ResumableLoader:
    source = ListSource([row for row in _IMAGES])
    return ResumableLoader(source, batch_size=5, seed=4, num_epochs=2, map_fn=_worker_fns.augment)


@register("read_batch-source", num_steps=7)
def _read_batch() -> ResumableLoader:
    return ResumableLoader(_worker_fns.CountingSource(37), batch_size=5, seed=5, num_epochs=2)


@register("thread-workers", num_steps=7)
def _threads() -> ResumableLoader:
    return ResumableLoader(
        _IMAGES, batch_size=5, seed=6, num_epochs=2, map_fn=_worker_fns.augment,
        workers=Workers(2, kind="thread"),
    )


@register("process-workers", num_steps=9, break_points=(3, 8))
def _processes() -> ResumableLoader:
    return ResumableLoader(
        _IMAGES, batch_size=5, seed=7, num_epochs=2, map_fn=_worker_fns.augment,
        workers=Workers(2, kind="process"),
    )


@register("auto-workers-map_fn", num_steps=9)
def _auto() -> ResumableLoader:
    # A map_fn of a few ms per batch: not "a cheap stage", so the measured trials switch
    # backends mid-stream (with `augment` auto settled on no workers at its first batch).
    return ResumableLoader(
        _IMAGES, batch_size=3, seed=22, num_epochs=2, map_fn=_worker_fns.slow,
        workers=Workers("auto", options=Tuning(trial_batches=1, trial_seconds=0)),
    )


@register("auto-workers-flipping-every-2-batches", num_steps=9, break_points=(3, 8))
def _auto_flipping() -> ResumableLoader:
    # Threads, none, processes, 3 threads, two batches each: the stream must not change.
    return ResumableLoader(
        _IMAGES, batch_size=5, seed=7, num_epochs=2, map_fn=_worker_fns.augment,
        workers=Workers("auto", options=Tuning(decide=_worker_fns.flip_workers)),
    )


@register("auto-workers-and-windows-flipping", num_steps=9, break_points=(3, 8))
def _auto_windows() -> ResumableLoader:
    # Workers and their window (the tasks in flight) changing every few batches.
    return ResumableLoader(
        _IMAGES, batch_size=5, seed=7, num_epochs=2, map_fn=_worker_fns.augment,
        workers=Workers("auto", options=Tuning(decide=_worker_fns.flip_workers_and_windows)),
    )


@register("process-workers-window-auto", num_steps=7)
def _processes_window_auto() -> ResumableLoader:
    return ResumableLoader(
        _IMAGES, batch_size=4, seed=9, num_epochs=2, map_fn=_worker_fns.augment,
        workers=Workers(2, kind="process", window="auto"),
    )


@register("shard-1-of-3", num_steps=3)
def _shard() -> ResumableLoader:
    return ResumableLoader(
        _IMAGES, batch_size=4, seed=8, num_epochs=3, shard=Shard(1, 3),
        map_fn=_worker_fns.augment,
    )


@register("unshuffled-drop-remainder-endless", num_steps=9)
def _unshuffled() -> ResumableLoader:
    return ResumableLoader(_IMAGES, batch_size=5, seed=9, shuffle=False, drop_remainder=True)


@register("graph-block-order-dict-shard-1-of-2-metadata", num_steps=7)
def _graph_blocks() -> ResumableLoader:
    data = {"image": _IMAGES, "label": _LABELS}
    pipeline = Pipeline(data, seed=17).shuffle(chunk_records=3, window_chunks=2).batch(2)
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=3, shard=Shard(1, 2), with_metadata=True
    )


@register("graph-endless-drop-remainder-shard-2-of-3-no-prefetch", num_steps=9)
def _graph_endless() -> ResumableLoader:
    pipeline = Pipeline(_LABELS, seed=18).shuffle().batch(3, drop_remainder=True)
    return ResumableLoader.from_pipeline(pipeline, shard=Shard(2, 3), prefetch=None)


def _unaligned(array: np.ndarray) -> np.ndarray:
    """A copy of `array` 16 bytes past a 64-byte boundary, as large NumPy and ``np.load``
    arrays are: the graph path gathers it by NumPy a chunk at a time."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + 16
    view = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


@register("graph-unaligned-column-block-order", num_steps=9, break_points=(3, 8))
def _graph_unaligned() -> ResumableLoader:
    data = {"image": _IMAGES, "label": _unaligned(_LABELS)}
    pipeline = Pipeline(data, seed=19).shuffle(chunk_records=4, window_chunks=2).batch(3)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2)


@register("composed-pipeline-two-maps", num_steps=7)
def _composed() -> ResumableLoader:
    pipeline = (
        Pipeline(ListSource([row for row in _IMAGES]), seed=10)
        .shuffle()
        .map(_worker_fns.augment)
        .map(_worker_fns.augment)
        .batch(6)
    )
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2, prefetch=None)




# Mixtures: two sources of other lengths and one record structure, 70/30.
_WEB = np.arange(29 * 3, dtype=np.float32).reshape(29, 3)
_CODE = -np.arange(11 * 3, dtype=np.float32).reshape(11, 3)


def _mixture(seed: int, **kwargs) -> Pipeline:
    return Pipeline.mix({"web": _WEB, "code": _CODE}, weights={"web": 0.7, "code": 0.3},
                        seed=seed, **kwargs)


@register("mix-70-30-read_batch", num_steps=9)
def _mix() -> ResumableLoader:
    return ResumableLoader.from_pipeline(_mixture(11).batch(5), num_epochs=2)


@register("mix-map_fn-process-workers", num_steps=9, break_points=(3, 8))
def _mix_processes() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _mixture(12).map(_worker_fns.augment).batch(5), num_epochs=2,
        workers=Workers(2, kind="process"),
    )


@register("mix-shard-1-of-2-thread-workers-metadata", num_steps=5)
def _mix_shard() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _mixture(13).map(_worker_fns.augment).batch(3), num_epochs=3, shard=Shard(1, 2),
        workers=Workers(2), with_metadata=True,
    )


@register("mix-unshuffled-fixed-epoch-endless", num_steps=9)
def _mix_endless() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _mixture(14, shuffle=False, records_per_epoch=23).batch(4, drop_remainder=True)
    )


# The run's data history: amendments at positions (docs/guides/changing-data.md).
_MATH = np.arange(7 * 3, dtype=np.float32).reshape(7, 3) + 0.5


@register("mix-amended-source-added-removed-skip-map_fn-thread-workers-metadata", num_steps=9)
def _mix_amended() -> ResumableLoader:
    pipeline = (
        _mixture(15)
        .amend(12, weights={"web": 1, "code": 1, "math": 1}, add={"math": _MATH})
        .amend(27, weights={"web": 1, "code": 0, "math": 2})
        .skip(40, 50)
    )
    return ResumableLoader.from_pipeline(
        pipeline.map(_worker_fns.augment).batch(5), num_epochs=2, workers=Workers(2),
        with_metadata=True,
    )


@register("skip-across-an-epoch-shard-1-of-2-drop-remainder", num_steps=5)
def _skip_shard() -> ResumableLoader:
    pipeline = Pipeline(_IMAGES[:36], seed=16).shuffle().skip(30, 48)
    return ResumableLoader.from_pipeline(
        pipeline.batch(4, drop_remainder=True), num_epochs=3, shard=Shard(1, 2)
    )


@register("on_error-skip-mix-map_fn-shard-1-of-2-thread-workers-metadata", num_steps=7)
def _on_error_skip() -> ResumableLoader:
    # Failing records in both sources, replaced by seeded records of the mixture.
    web = _worker_fns.BadRecordSource(29, {3, 17, 20})
    code = _worker_fns.BadRecordSource(11, {4})
    pipeline = (
        Pipeline.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=15)
        .map(_worker_fns.augment)
        .on_error("skip", max_fraction=1.0, quarantine=_quarantine())
        .batch(3)
    )
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=3, shard=Shard(1, 2), workers=Workers(2), with_metadata=True,
    )


@functools.cache
def _quarantine() -> str:
    folder = tempfile.mkdtemp(prefix="resumeloader-quarantine-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return os.path.join(folder, "quarantine.jsonl")


# Batching records of varying length: padding, bucketing, packing, token budgets.
_SEQUENCES = [np.arange(1 + (i * 7) % 13, dtype=np.int64) + 100 * i for i in range(37)]


def _sequences(seed: int) -> Pipeline:
    return Pipeline({"tokens": _SEQUENCES, "label": _LABELS}, seed=seed).shuffle()


@register("padded_batch-mask-thread-workers-shard-1-of-2", num_steps=4)
def _padded() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _sequences(20).padded_batch(3, mask=True), num_epochs=2, shard=Shard(1, 2),
        workers=Workers(2, kind="thread"),
    )


@register("bucket_by_length-process-workers", num_steps=9, break_points=(2, 5, 9))
def _bucket_processes() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _sequences(21).bucket_by_length(3, window=9, pad_to=16), num_epochs=2,
        workers=Workers(2, kind="process"),
    )


@register("bucket_by_length-skipped-windows-metadata", num_steps=7)
def _bucket_skip() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _sequences(23).skip(18, 36).bucket_by_length(3, window=9), num_epochs=2,
        with_metadata=True,
    )


@register("bucket_by_length-shard-2-of-3-metadata-drop-remainder", num_steps=5)
def _bucket_shard() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _sequences(22).bucket_by_length(2, window=6, drop_remainder=True), num_epochs=3,
        shard=Shard(2, 3), with_metadata=True,
    )


@register("pack-map_fn-thread-workers-shard-0-of-2", num_steps=5)
def _pack_shard() -> ResumableLoader:
    import tensorflow as tf

    pipeline = Pipeline(_SEQUENCES, seed=23).shuffle().map(
        _worker_fns.augment, output_signature=tf.TensorSpec((None,), tf.int64)
    )
    return ResumableLoader.from_pipeline(
        pipeline.pack(20, window=8, batch_size=2), num_epochs=2, shard=Shard(0, 2),
        workers=Workers(2, kind="thread"),
    )


@register("pack-dict-process-workers", num_steps=7, break_points=(1, 4, 7))
def _pack_processes() -> ResumableLoader:
    data = {"inputs": _SEQUENCES, "targets": _SEQUENCES[::-1]}
    pipeline = Pipeline(data, seed=24).shuffle().pack(24, window=10, batch_size=2)
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, workers=Workers(2, kind="process")
    )


@register("batch_by_tokens-boundaries-thread-workers-shard-1-of-2-endless", num_steps=9)
def _tokens_endless() -> ResumableLoader:
    pipeline = _sequences(25).batch_by_tokens(30, window=12, boundaries=(5, 9), mask=True)
    return ResumableLoader.from_pipeline(
        pipeline, shard=Shard(1, 2), workers=Workers(2, kind="thread")
    )


_WORDS = [f"record-{i}" * (i % 4) for i in range(37)]
_TOKENS = [np.arange(i % 6, dtype=np.int64) + i for i in range(37)]


@register("strings-and-ragged-columns", num_steps=7)
def _variable() -> ResumableLoader:
    data = {"text": _WORDS, "tokens": _TOKENS, "label": _LABELS}
    return ResumableLoader(data, batch_size=5, seed=11, num_epochs=2)


@register("ragged-map_fn-thread-workers", num_steps=7)
def _ragged_threads() -> ResumableLoader:
    import tensorflow as tf

    return ResumableLoader(
        ListSource(_TOKENS), batch_size=5, seed=12, num_epochs=2, map_fn=_worker_fns.augment,
        output_signature=tf.TensorSpec((None,), tf.int64), workers=Workers(2, kind="thread"),
    )


def _tf_augment(batch, seeds):
    import tensorflow as tf

    def one(args):
        row, seed = args
        return row + tf.random.stateless_uniform(tf.shape(row), seed)

    return tf.map_fn(one, (batch, seeds), fn_output_signature=tf.float32)


# Each restore traces the stage anew: three break points (start, mid-epoch, the epoch
# boundary) keep it to ~4 s; test_tf_map.py restores it at three more.
@register("tf_map-stateless-random", num_steps=7, break_points=(0, 4, 8))
def _tf_map() -> ResumableLoader:
    pipeline = Pipeline(_IMAGES, seed=13).shuffle().batch(5).tf_map(_tf_augment)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2)


@functools.cache
def _files() -> str:
    """A temporary folder with the same 37 serialized records as TFRecord and ArrayRecord."""
    import tensorflow as tf

    folder = tempfile.mkdtemp(prefix="resumeloader-conformance-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    records = [word.encode() for word in _WORDS]
    for shard in range(2):
        with tf.io.TFRecordWriter(os.path.join(folder, f"part-{shard}.tfrecord")) as writer:
            for record in records[shard::2]:
                writer.write(record)
    if importlib.util.find_spec("array_record"):
        from array_record.python import array_record_module

        writer = array_record_module.ArrayRecordWriter(
            os.path.join(folder, "all.array_record"), "group_size:1"
        )
        for record in records:
            writer.write(record)
        writer.close()
        writer = array_record_module.ArrayRecordWriter(
            os.path.join(folder, "code.array_record"), "group_size:1"
        )
        for record in records[:13]:
            writer.write(b"#" + record[::-1])
        writer.close()
    os.mkdir(os.path.join(folder, "words"))  # the same records as one file each
    for number, record in enumerate(records):
        with open(os.path.join(folder, "words", f"{number:02d}.txt"), "wb") as f:
            f.write(record)
    return folder


@register("tfrecord-source-tf_map", num_steps=7)
def _tfrecord() -> ResumableLoader:
    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=14).shuffle().batch(5).tf_map(_lengths)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2, with_metadata=True)


@register("tfrecord_graph-global-shuffle-windows-of-two-batches-metadata", num_steps=9)
def _tfrecord_graph_shuffle() -> ResumableLoader:
    # The tfrecord_graph path in the global shuffle: windows of 2 batches of 4 (an epoch's
    # last window and batch short), each spooled into a memfd file by runs. (The window
    # is about WINDOW_BYTES of records, read when the path is built: small here.)
    from resumeloader.tfdata import tfrecord_graph

    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=27).shuffle().batch(4)
    saved = tfrecord_graph.WINDOW_BYTES
    tfrecord_graph.WINDOW_BYTES = int(source.mean_record_bytes() * 4 * 2.5)
    try:
        return ResumableLoader.from_pipeline(pipeline, num_epochs=3, with_metadata=True)
    finally:
        tfrecord_graph.WINDOW_BYTES = saved


@register("tfrecord-read_batch-global-shuffle-thread-workers", num_steps=7)
def _tfrecord_read_batch() -> ResumableLoader:
    # Workers asked for: the read_batch path (`TFRecordSource.read_packed`, from_generator).
    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=28).shuffle().batch(5).tf_map(_lengths)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2, with_metadata=True,
                                         workers=Workers(2, kind="thread"))


@register("tfrecord-block-order-tf_map-seeds", num_steps=7)
def _tfrecord_blocks() -> ResumableLoader:
    # Local blocks read whole and held (`TFRecordSource.blocked`); the seeds handed over
    # alone (no metadata yielded).
    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=16).shuffle(chunk_records=4, window_chunks=2)
    return ResumableLoader.from_pipeline(pipeline.batch(5).tf_map(_lengths), num_epochs=2)


@register("tfrecord_graph-block-order-straddling-batches-metadata", num_steps=9)
def _tfrecord_graph() -> ResumableLoader:
    # The tfrecord_graph path: windows of 6 records read by TensorFlow's reader, batches
    # of 4 straddling them, the last window and batch of an epoch short.
    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=25).shuffle(chunk_records=3, window_chunks=2).batch(4)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=3, with_metadata=True)


@register("tfrecord_graph-endless-drop-remainder-batch-over-windows-no-prefetch", num_steps=9)
def _tfrecord_graph_endless() -> ResumableLoader:
    # Batches of 5 over windows of 2 records (a batch takes rows of three windows).
    source = TFRecordSource(
        os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
    )
    pipeline = Pipeline(source, seed=26).shuffle(chunk_records=2, window_chunks=1)
    return ResumableLoader.from_pipeline(
        pipeline.batch(5, drop_remainder=True), prefetch=None)


def _lengths(batch, seeds):
    import tensorflow as tf

    return batch, tf.strings.length(batch) + tf.cast(seeds[:, 1], tf.int32)


# The optional extras are in the `test` extra that CI installs; without them these
# sources cannot be built, so they are registered only when their package is there.
if importlib.util.find_spec("array_record"):

    @register("array_record-source", num_steps=7)
    def _array_record() -> ResumableLoader:
        source = ArrayRecordSource(os.path.join(_files(), "all.array_record"))
        return ResumableLoader(source, batch_size=5, seed=15, num_epochs=2)


    # Mixtures of real sources: TFRecord and ArrayRecord bytes, read by batch and by a map_fn.
    def _file_mixture(seed: int) -> Pipeline:
        web = TFRecordSource(
            os.path.join(_files(), "part-*.tfrecord"), index_dir=os.path.join(_files(), "index")
        )
        code = ArrayRecordSource(os.path.join(_files(), "code.array_record"))
        return Pipeline.mix({"web": web, "code": code}, weights={"web": 0.6, "code": 0.4},
                            seed=seed)

    @register("mix-tfrecord-array_record-bytes-read_batch", num_steps=9)
    def _mix_files() -> ResumableLoader:
        return ResumableLoader.from_pipeline(_file_mixture(17).batch(5), num_epochs=2)

    @register("mix-tfrecord-array_record-map_fn-process-workers", num_steps=9,
              break_points=(3, 8))
    def _mix_files_map() -> ResumableLoader:
        signature = {"raw": _string_spec(), "tokens": _ragged_spec()}
        return ResumableLoader.from_pipeline(
            _file_mixture(18).map(_worker_fns.decode_bytes, output_signature=signature).batch(5),
            num_epochs=2, workers=Workers(2, kind="process"),
        )


# Object storage: the same records as TFRecord and ArrayRecord objects in moto's S3 server
# and fake-gcs-server (session fixtures of _objstore_fixtures, through their fault proxy).
@functools.cache
def _objects(kind: str) -> tuple[str, dict]:
    """The conformance files uploaded to the running `kind` store: (folder URL, options)."""
    store = _objstore_fixtures.ACTIVE[kind]
    folder = store.folder()
    for name in ("part-0.tfrecord", "part-1.tfrecord", "all.array_record"):
        if os.path.exists(os.path.join(_files(), name)):
            with open(os.path.join(_files(), name), "rb") as f:
                store.put(f"{folder}/{name}", f.read())
    return store.url(folder), store.options


def _object_tfrecords(kind: str) -> TFRecordSource:
    url, options = _objects(kind)
    index = os.path.join(_files(), f"index-{kind}")
    return TFRecordSource(
        f"{url}/part-*.tfrecord", index_dir=index, storage=Storage(options=options)
    )


@register("tfrecord-s3-block-order-tf_map", num_steps=7, needs=("s3_store",))
def _tfrecord_s3() -> ResumableLoader:
    # The tfrecord_graph path: each window's blocks spooled into a memfd file.
    pipeline = Pipeline(_object_tfrecords("s3"), seed=21).shuffle(chunk_records=4, window_chunks=2)
    return ResumableLoader.from_pipeline(
        pipeline.batch(5).tf_map(_lengths), num_epochs=2, with_metadata=True
    )


@register("tfrecord-s3-block-order-read_batch-workers1", num_steps=7, needs=("s3_store",))
def _tfrecord_s3_read_batch() -> ResumableLoader:
    # The same objects and order on the read_batch path (a worker asked for).
    pipeline = Pipeline(_object_tfrecords("s3"), seed=21).shuffle(chunk_records=4, window_chunks=2)
    return ResumableLoader.from_pipeline(
        pipeline.batch(5).tf_map(_lengths), num_epochs=2, with_metadata=True, workers=Workers(1)
    )


@register("file_source-block-order-process-workers", num_steps=7)
def _file_source() -> ResumableLoader:
    source = FileSource(os.path.join(_files(), "words", "*.txt"))
    pipeline = Pipeline(source, seed=25).shuffle(chunk_records=4, window_chunks=2).batch(5)
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, workers=Workers(2, kind="process")
    )


@register("tfrecord-gcs-shuffle-thread-workers", num_steps=7, needs=("gcs_store",))
def _tfrecord_gcs() -> ResumableLoader:
    pipeline = Pipeline(_object_tfrecords("gcs"), seed=22).shuffle().batch(5)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2, workers=Workers(2, kind="thread"))


if importlib.util.find_spec("array_record"):

    def _object_array_records(kind: str) -> ArrayRecordSource:
        url, options = _objects(kind)
        copies = os.path.join(_files(), f"copies-{kind}")
        return ArrayRecordSource(
            f"{url}/all.array_record", storage=Storage(options=options, cache_dir=copies)
        )

    @register("array_record-s3-shuffle", num_steps=7, needs=("s3_store",))
    def _array_record_s3() -> ResumableLoader:
        return ResumableLoader(_object_array_records("s3"), batch_size=5, seed=23, num_epochs=2)

    @register("array_record-gcs-block-order", num_steps=7, needs=("gcs_store",))
    def _array_record_gcs() -> ResumableLoader:
        pipeline = Pipeline(_object_array_records("gcs"), seed=24).shuffle(block="200B")
        return ResumableLoader.from_pipeline(pipeline.batch(5), num_epochs=2)


if importlib.util.find_spec("datasets"):

    @register("mix-hugging_face-strings-ragged-thread-workers", num_steps=7)
    def _mix_hugging_face() -> ResumableLoader:
        import datasets

        def part(words: list[str], tokens: list[np.ndarray]) -> object:
            data = {"text": words, "tokens": [t.tolist() for t in tokens]}
            return datasets.Dataset.from_dict(data)

        pipeline = Pipeline.mix(
            {"a": part(_WORDS, _TOKENS), "b": part(_WORDS[:9][::-1], _TOKENS[9:18])},
            weights={"a": 3, "b": 2},
            seed=19,
        )
        return ResumableLoader.from_pipeline(
            pipeline.batch(4), num_epochs=2, workers=Workers(2, kind="thread")
        )


    @register("hugging_face-dataset-map_fn", num_steps=7)
    def _hugging_face() -> ResumableLoader:
        import datasets

        data = {"text": _WORDS, "tokens": [t.tolist() for t in _TOKENS], "label": _LABELS}
        source = HuggingFaceSource(datasets.Dataset.from_dict(data))
        return ResumableLoader(
            source, batch_size=5, seed=16, num_epochs=2, map_fn=_worker_fns.augment_tokens,
            output_signature={"text": _string_spec(), "tokens": _ragged_spec()},
        )


def _string_spec():
    import tensorflow as tf

    return tf.TensorSpec((), tf.string)


def _ragged_spec():
    import tensorflow as tf

    return tf.TensorSpec((None,), tf.int64)


# The option values of 0.3 (`Workers`, `Shard`, the record spec where the stream is
# defined): one entry per worker backend (test_conformance.py asks for every kind in
# resumeloader.workers.registry).
@register("workers-inline-shard-1-of-2-output_signature-on-map", num_steps=5)
def _inline_values() -> ResumableLoader:
    pipeline = (
        Pipeline(ListSource(_TOKENS), seed=30).shuffle()
        .map(_worker_fns.augment, output_signature=_ragged_spec()).batch(4)
    )
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, shard=Shard(1, 2), workers=Workers()
    )


@register("workers-thread-window-3-pack", num_steps=5)
def _thread_values() -> ResumableLoader:
    pipeline = Pipeline(_SEQUENCES, seed=31).shuffle().pack(20, window=8, batch_size=2)
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, workers=Workers(2, kind="thread", window=3)
    )


@register("workers-process-window-6-mix-shard-0-of-2", num_steps=7, break_points=(3, 7))
def _process_values() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _mixture(32).map(_worker_fns.augment).batch(3), num_epochs=2, shard=Shard(0, 2),
        workers=Workers(2, kind="process", window=6),
    )


# The Dask backend, on the session's LocalCluster of 2 process workers (tests/_dask.py):
# a mixture, a windowed stage and the bad-record policy.
def _dask_workers(**kwargs) -> Workers:
    import _dask

    return Workers(kind="dask", options=DaskOptions(client=_dask.local()), **kwargs)


@register("dask-mix-map_fn-shard-1-of-2", num_steps=7, break_points=(3, 7))
def _dask_mix() -> ResumableLoader:
    return ResumableLoader.from_pipeline(
        _mixture(40).map(_worker_fns.augment).batch(3), num_epochs=2, shard=Shard(1, 2),
        workers=_dask_workers(),
    )


@register("dask-pack-map_fn-window-3", num_steps=5, break_points=(1, 4))
def _dask_pack() -> ResumableLoader:
    import tensorflow as tf

    pipeline = Pipeline(_SEQUENCES, seed=41).shuffle().map(
        _worker_fns.augment, output_signature=tf.TensorSpec((None,), tf.int64)
    )
    return ResumableLoader.from_pipeline(
        pipeline.pack(20, window=8, batch_size=2), num_epochs=2, workers=_dask_workers(window=3)
    )


@register("dask-on_error-skip-mix-map_fn-metadata", num_steps=7, break_points=(3, 7))
def _dask_on_error() -> ResumableLoader:
    web = _worker_fns.BadRecordSource(29, {3, 17, 20})
    code = _worker_fns.BadRecordSource(11, {4})
    pipeline = (
        Pipeline.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=42)
        .map(_worker_fns.augment)
        .on_error("skip", max_fraction=1.0, quarantine=_quarantine())
        .batch(3)
    )
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, with_metadata=True, workers=_dask_workers()
    )
# Batch-level Python augmentation (issue 24, `Pipeline.map_batch`): inline, in thread
# and process workers, with a shard, row-wise and not.
@register("map_batch-rowwise-inline", num_steps=7)
def _map_batch_inline() -> ResumableLoader:
    pipeline = (Pipeline((_IMAGES, _LABELS), seed=40).shuffle().batch(5)
                .map_batch(_worker_fns.flip_scale_batch))
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2)


# Rows of 4,096 float32: a batch of 5 is 80 KiB, written into the loader's `out` and
# handed to TensorFlow uncopied.
_WIDE = np.arange(37 * 4096, dtype=np.float32).reshape(37, 4096) % 89


@register("map_batch-out-inline", num_steps=7)
def _map_batch_out() -> ResumableLoader:
    pipeline = (Pipeline((_WIDE, _LABELS), seed=40).shuffle().batch(5)
                .map_batch(_worker_fns.flip_scale_into, out=True))
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2)


@register("map_batch-after-map_fn-thread-workers-shard-1-of-2", num_steps=4)
def _map_batch_threads() -> ResumableLoader:
    pipeline = (Pipeline(_IMAGES, seed=41).shuffle().map(_worker_fns.augment).batch(4)
                .map_batch(_worker_fns.augment_batch))
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, shard=Shard(1, 2), workers=Workers(2, kind="thread"))


@register("map_batch-process-workers-metadata", num_steps=9, break_points=(3, 8))
def _map_batch_processes() -> ResumableLoader:
    pipeline = (Pipeline(_IMAGES, seed=42).shuffle().batch(5)
                .map_batch(_worker_fns.augment_batch))
    return ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, with_metadata=True, workers=Workers(2, kind="process"))


@register("map_batch-not-rowwise-tf_map", num_steps=7)
def _map_batch_mixing() -> ResumableLoader:
    pipeline = (Pipeline(_IMAGES, seed=43).shuffle().batch(5)
                .map_batch(_worker_fns.mix_rows_batch, rowwise=False).tf_map(_tf_augment))
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2)
