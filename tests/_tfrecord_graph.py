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
