"""What the tests of the ``tfrecord_graph`` path share, over local files and over objects:
the records (four files or objects of 9, 0, 13 and 19 records, an empty one included,
records of 0-60 bytes), a loader over a source, the path a loader took, a batch's values,
and the same loader on the ``read_batch`` path."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader
from resumeloader.tfdata import paths

CUTS = (0, 9, 9, 22, 41)
RECORDS = [f"record-{i}:".encode() * (i % 6) for i in range(41)]


def loader(source: Any, *, chunk: int = 4, window: int = 2, batch: int = 5, drop: bool = False,
           epochs: int = 2, metadata: bool = False, stages: bool = False,
           **options: Any) -> ResumableLoader:
    """`source` in the block order (`chunk` records a chunk, `window` chunks a window),
    batches of `batch`, with a `tf_map` when `stages`."""
    pipeline = Pipeline(source, seed=7).shuffle(chunk_records=chunk, window_chunks=window)
    pipeline = pipeline.batch(batch, drop_remainder=drop)
    if stages:
        pipeline = pipeline.tf_map(lengths)
    return ResumableLoader.from_pipeline(pipeline, num_epochs=epochs, with_metadata=metadata,
                                         **options)


def lengths(batch: tf.Tensor, seeds: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return batch, tf.strings.length(batch) + tf.cast(seeds[:, 1], tf.int32)


def dataset_error(made: ResumableLoader) -> str:
    """The message of the error iterating `made.dataset()` raises: the source's
    RecordError, carried through TensorFlow (not TensorFlow's own DataLossError)."""
    try:
        list(made.dataset())
    except tf.errors.OpError as err:
        message = str(err)
    else:
        raise AssertionError("the dataset() iteration raised no error")
    assert "RecordError" in message and "DataLoss" not in message, message
    return message


def path(made: ResumableLoader) -> str:
    """The delivery path `made` took, as `describe()` names it."""
    return made.describe().split("path:")[0].split()[-1]


def values(element: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy().tolist(), element)


def produced(monkeypatch: Any, make: Any) -> ResumableLoader:
    """The loader `make()` builds, on the ``read_batch`` path (the paths it would take
    without ``tfrecord_graph``)."""
    with monkeypatch.context() as patch:
        patch.setattr(paths, "PATHS",
                      tuple(p for p in paths.PATHS if p.name != "tfrecord_graph"))
        made = make()
    assert path(made) == "read_batch"
    return made


def assert_restores_at_every_batch(monkeypatch: Any, make: Any) -> None:
    """From the state after each batch of the loader `make()` builds on the
    ``read_batch`` path (`produced`), the rest of the stream of `make()` on the
    ``tfrecord_graph`` path is that path's (mid-window, at a window's and an epoch's end)."""
    reference = produced(monkeypatch, make)
    states, stream = [], []
    for batch in reference:
        stream.append(values(batch))
        states.append(reference.get_state())
    loader = make()
    assert path(loader) == "tfrecord_graph"
    for number, state in enumerate(states):
        loader.set_state(state)
        assert [values(b) for b in loader.dataset()] == stream[number + 1 :], number


def assert_restores_at_offsets(monkeypatch: Any, make: Any, saved: dict[str, Any],
                               offsets: tuple[int, ...], per_epoch: int) -> None:
    """`saved` (a state of another loader, e.g. of another batch size) at each of
    `offsets` (positions from epoch 0, `per_epoch` records an epoch), restored into
    `make()` on the ``tfrecord_graph`` path and on the ``read_batch`` path: the same
    streams."""
    loader, reference = make(), produced(monkeypatch, make)
    assert path(loader) == "tfrecord_graph"
    for offset in offsets:
        state = dict(saved, offset=offset % per_epoch, epoch=offset // per_epoch)
        loader.set_state(state)
        reference.set_state(state)
        expected = [values(b) for b in reference.dataset()]
        assert [values(b) for b in loader.dataset()] == expected, offset


def flip(path: Any, record: int) -> int:
    """Flips a data byte of `record` (a number in the TFRecord file at `path`); returns
    the record's byte offset."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):
        length = int.from_bytes(data[offset : offset + 8], "little")
        offset += 16 + length
    data[offset + 12 + 2] ^= 0x01
    path.write_bytes(bytes(data))
    return offset


def write_files(folder: Any) -> Any:
    """`RECORDS` written into four TFRecord files ``part-<n>.tfrecord`` in `folder` (cut
    at `CUTS`: the second is empty); returns `folder`."""
    for number in range(4):
        with tf.io.TFRecordWriter(str(folder / f"part-{number}.tfrecord")) as writer:
            for record in RECORDS[CUTS[number] : CUTS[number + 1]]:
                writer.write(record)
    return folder
