"""ResumableLoader.describe() and repr: the execution plan, one line of repr."""

from __future__ import annotations

import io

import _worker_fns as fns
import numpy as np
import pytest
from rich.console import Console

import resumeloader


def _loader(**kwargs) -> resumeloader.ResumableLoader:
    options = {"batch_size": 4, "seed": 5, "num_epochs": 3}
    options.update(kwargs)
    return resumeloader.ResumableLoader(np.zeros((10, 2, 3), np.uint8), **options)


def _stages(text: str) -> list[str]:
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    return [row for row in rows[1:] if row]  # drop the header, keep first lines of rows


@pytest.mark.parametrize(
    ("kwargs", "stages"),
    [
        ({}, ["position", "sampler", "source", "order", "map", "prefetch"]),
        (
            {"workers": resumeloader.Workers(1), "prefetch": 2},
            ["position", "sampler", "source", "workers", "from_generator", "prefetch"],
        ),
        (
            {"map_fn": fns.augment, "prefetch": None, "workers": resumeloader.Workers(2)},
            ["position", "sampler", "source", "map_fn", "workers", "from_generator"],
        ),
    ],
    ids=["arrays-graph", "arrays-1-worker", "map_fn-workers-no-prefetch"],
)
def test_describe_configuration_lists_stages_in_order(kwargs, stages):
    """describe() has one row per pipeline stage, from the position to prefetch."""
    assert _stages(_loader(**kwargs).describe()) == stages


def test_describe_states_what_is_checkpointed():
    """The position is the only checkpointed stage; the sampler is derived from it."""
    text = _loader().describe()
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert "CHECKPOINTED" in lines["position"]
    assert "derived" in lines["sampler"]
    assert sum(line.endswith("CHECKPOINTED │") for line in text.splitlines()) == 1


def test_describe_after_consuming_shows_position_and_epoch():
    """describe() reports the current epoch, step and position."""
    loader = _loader()
    loader.advance(4)  # 3 batches per epoch: epoch 1, step 1
    assert "epoch 1, step 1, position 14" in " ".join(loader.describe().split())


def test_describe_shows_signature_and_workers():
    """describe() shows the batch signature and the worker plan."""
    text = " ".join(_loader(workers=resumeloader.Workers(2, kind="process")).describe().split())
    assert "uint8[None,2,3]" in text
    assert "2 process workers" in text
    assert "shared memory" in text


def test_describe_console_prints_same_plan():
    """With a plain 92-column console, describe() prints exactly the text it returns."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=92, color_system=None)
    text = _loader().describe(console=console)
    assert buffer.getvalue() == text


def test_repr_is_one_line():
    """repr(loader) is a single line naming the configuration and position."""
    text = repr(_loader(workers=resumeloader.Workers(1)))
    assert "\n" not in text
    assert text.startswith("ResumableLoader(num_records=10, batch_size=4, seed=5")


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({}, "graph"),
        ({"workers": resumeloader.Workers(1)}, "read_batch"),
        ({"map_fn": fns.augment}, "records"),
    ],
    ids=["arrays", "arrays-1-worker", "map_fn"],
)
def test_describe_names_the_delivery_path(kwargs, path):
    """The hand-over row names the delivery path the loader took."""
    text = _loader(**kwargs).describe()
    assert f"{path} path:" in text


def test_describe_names_the_gather_path_for_arrays_with_skips():
    """Arrays whose layout has no graph form (a skipped range) take the gather path."""
    pipeline = resumeloader.Pipeline(np.zeros((10, 3), np.float32), seed=0).skip(2, 4)
    loader = resumeloader.ResumableLoader.from_pipeline(pipeline.batch(4), num_epochs=2)
    assert "gather path:" in loader.describe()


def _tfrecord_loader(tmp_path, **kwargs) -> resumeloader.ResumableLoader:
    import tensorflow as tf

    from resumeloader.sources import TFRecordSource

    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(12):
            writer.write(b"r" * (i + 1))
    source = TFRecordSource(path, index_dir=str(tmp_path))
    pipeline = resumeloader.Pipeline(source, seed=0).shuffle().batch(4)
    return resumeloader.ResumableLoader.from_pipeline(pipeline, num_epochs=1, **kwargs)


def _source_row(text: str) -> str:
    """The source row's `what` cell, its lines joined."""
    cells, inside = [], False
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        name, what = (part.strip() for part in line.split("│")[1:3])
        inside = name == "source" or (inside and not name)
        if inside:
            cells.append(what)
    return " ".join(cells)


def test_describe_tfrecord_source_read_in_runs_names_read_packed(tmp_path):
    """A TFRecord batch read as runs (`read_packed`, a worker asked for) is described so,
    not as `read_batch`."""
    loader = _tfrecord_loader(tmp_path, workers=resumeloader.Workers(1))
    text = _source_row(loader.describe())
    assert text == "TFRecordSource(1 file): read_packed(indices): records read in runs"


def test_describe_tfrecord_source_spooled_by_windows(tmp_path):
    """Without workers the global shuffle's windows are spooled for TensorFlow's reader
    (the tfrecord_graph path), and the row says so: a window of the whole epoch here."""
    text = _source_row(_tfrecord_loader(tmp_path).describe())
    assert text == (
        "TFRecordSource(1 file): each window of 12 positions: its records, sorted, read "
        "by runs (one preadv each) into a memfd file, read by TensorFlow's TFRecord "
        "reader (TFRecordDatasetV2, CRC32C checked)")


def test_describe_arrays_with_a_worker_name_read_batch():
    """Arrays read a batch per `read_batch` call, and say so."""
    text = _source_row(_loader(workers=resumeloader.Workers(1)).describe())
    assert text.endswith(": read_batch(indices)")


def _at_offset(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `array` whose data starts `offset` bytes past a 64-byte boundary (large
    NumPy arrays, and ``np.load``'s, start 16 bytes off)."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def _cells(text: str) -> dict[str, str]:
    """Each row's `what` cell (its lines joined), by stage."""
    cells: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("│"):
            first, what = (part.strip() for part in line.split("│")[1:3])
            name = first or name
            cells[name] = f"{cells.get(name, '')} {what}".strip()
    return cells


_ARRAY = np.arange(10 * 6, dtype=np.float32).reshape(10, 6)


@pytest.mark.parametrize("skips", [False, True], ids=["graph-path", "gather-path"])
def test_describe_says_an_aligned_array_is_gathered_by_tensorflow_in_place(skips):
    """An array TensorFlow can address: indices (graph path) and rows in TensorFlow ops."""
    pipeline = resumeloader.Pipeline(_at_offset(_ARRAY, 0), seed=0)
    loader = resumeloader.ResumableLoader.from_pipeline(
        (pipeline.skip(2, 4) if skips else pipeline).batch(4), num_epochs=2)
    cells = _cells(loader.describe())
    assert cells["source"].endswith("as constant tensors")
    assert cells["map"].startswith("tf.gather(source, indices)")
    assert "NumPy" not in loader.describe()
    if not skips:
        assert cells["order"].startswith("graph path: record indices in TensorFlow ops")


@pytest.mark.parametrize("skips", [False, True], ids=["graph-path", "gather-path"])
def test_describe_says_an_unaligned_array_is_gathered_by_numpy(skips):
    """An array 16 bytes off 64-byte alignment (as ``np.load``'s): NumPy gathers its rows
    a chunk at a time (graph path: with the chunk's record indices), and describe() says so."""
    pipeline = resumeloader.Pipeline(_at_offset(_ARRAY, 16), seed=0)
    loader = resumeloader.ResumableLoader.from_pipeline(
        (pipeline.skip(2, 4) if skips else pipeline).batch(4), num_epochs=2)
    text = loader.describe()
    cells = _cells(text)
    assert "constant tensors" not in text and "tf.gather" not in text
    assert cells["source"].endswith("gathered by NumPy (not 64-byte aligned, strided, "
                                    "read-only or big-endian)")
    if skips:
        assert cells["map"].startswith("rows gathered by NumPy (numpy_function)")
    else:
        assert "TensorFlow ops" not in text
        assert cells["order"].startswith("graph path: record indices and rows of up to")
        assert "by NumPy (the plan's order, one numpy_function per chunk)" in cells["order"]
        assert cells["map"].startswith("each batch a slice of its chunk")


def test_describe_says_which_columns_numpy_gathers():
    """Aligned and unaligned columns together: each read as it is, and describe() counts them."""
    arrays = {"a": _at_offset(_ARRAY, 0), "b": _at_offset(_ARRAY[:, 0].copy(), 16)}
    loader = resumeloader.ResumableLoader(arrays, batch_size=4, seed=0, num_epochs=1)
    cells = _cells(loader.describe())
    assert "1 of 2 columns as constant tensors, 1 gathered by NumPy" in cells["source"]
    assert cells["map"].startswith("tf.gather(in-place columns, indices), the others a slice")
