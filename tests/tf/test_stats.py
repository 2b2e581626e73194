"""``loader.stats()``, ``describe()``'s figures, TensorBoard scalars and the log line: what
each stage did, counted per batch in every place (threads, worker processes), and the
consumer's data wait; the stream never depends on it."""

from __future__ import annotations

import json
import logging
import time

import _worker_fns as fns
import keras
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import Pipeline, ResumableLoader, Workers
from resumeloader.core import meters
from resumeloader.keras import ResumeCallback, epoch_dataset

_DATA = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)


def _loader(workers: Workers | None = None, **kwargs) -> ResumableLoader:
    kwargs.setdefault("map_fn", fns.augment)
    return ResumableLoader(_DATA, batch_size=4, seed=1, num_epochs=1, workers=workers,
                           **kwargs)


def test_for_loop_counts_every_stage_and_step_exactly():
    """Each stage of a `for batch in loader` counts every batch and record; the consumer
    every step."""
    loader = _loader()
    batches = [b for b in loader]
    stats = loader.stats()
    assert [s.name for s in stats.stages] == ["sampler", "read", "map_fn", "check", "batch",
                                              "hand-off"]
    for stage in stats.stages:
        assert (stage.batches, stage.records_in) == (16, 64), stage
        assert stage.wall_s > 0
    assert stats.stage("batch").bytes_out == _DATA.nbytes  # type: ignore[union-attr]
    assert stats.steps == len(batches) == 16
    assert stats.bottleneck in {s.name for s in stats.stages}


def test_for_loop_restored_mid_epoch_counts_exactly_what_it_makes():
    """A loop restored mid-epoch (its sampler, producer and hand-off counting in their own
    loops) counts exactly the batches and records it makes from there, every step."""
    first = _loader()
    with first:
        batches = iter(first)
        head = [next(batches) for _ in range(5)]
        state = first.get_state()
        batches.close()
    with _loader() as loader:
        loader.set_state(state)
        rest = [b for b in loader]
        stats = loader.stats()
    assert len(head) + len(rest) == 16
    assert [s.name for s in stats.stages] == ["sampler", "read", "map_fn", "check", "batch",
                                              "hand-off"]
    for stage in stats.stages:
        assert (stage.batches, stage.records_in) == (11, 44), stage
    assert stats.steps == 11


def test_stats_table_and_dict_describe_the_same_figures():
    """`str(stats)` is a table naming each stage; `to_dict()` is JSON with the same rows."""
    loader = _loader()
    _ = [b for b in loader]
    stats = loader.stats()
    text = str(stats)
    data = json.loads(json.dumps(stats.to_dict()))
    assert [s["name"] for s in data["stages"]] == [s.name for s in stats.stages]
    assert all(f"\n{s.name}" in text for s in stats.stages)
    assert f"bottleneck: {stats.bottleneck}" in text.splitlines()[0]
    assert data["consumer"]["steps"] == 16


@pytest.mark.parametrize("kind", ["thread", "process"], ids=["threads", "processes"])
def test_workers_counts_are_merged_across_workers(kind):
    """Worker threads and processes each count their batches; the sums are exact. The
    map_fn takes 2 ms a record: a worker busy with a task leaves the next to the other
    (with a fast one, one thread made all 16 batches on a loaded machine)."""
    loader = _loader(Workers(2, kind=kind), map_fn=fns.slow)
    _ = [b for b in loader]
    stats = loader.stats()
    mapped = stats.stage("map_fn")
    assert mapped is not None and (mapped.batches, mapped.records_in) == (16, 64)
    assert mapped.places == 2 and mapped.where == f"2 {kind} workers"
    assert sorted(w.name for w in stats.workers) == [f"{kind} worker 0", f"{kind} worker 1"]
    assert sum(q["max"] for q in stats.queues.values()) > 0  # the tasks in flight
    if kind == "process":
        assert stats.stage("transfer").records_in == 64  # type: ignore[union-attr]
        assert all(w.process_cpu_s for w in stats.workers)


def test_stream_is_the_same_with_counting_on_and_off(monkeypatch):
    """RESUMELOADER_STATS=0 counts nothing (empty stats) and changes no batch."""
    counted = [b.numpy() for b in _loader(Workers(2, kind="process"))]
    monkeypatch.setenv(meters.ENV, "0")
    loader = _loader(Workers(2, kind="process"))
    plain = [b.numpy() for b in loader]
    assert all(np.array_equal(a, b) for a, b in zip(counted, plain, strict=True))
    stats = loader.stats()
    assert not stats.counting and stats.stages == () and stats.bottleneck is None
    assert "RESUMELOADER_STATS=0" in str(stats)


def test_dataset_with_eager_advances_counts_the_consumers_steps():
    """dataset() consumed with an eager advance per step: each step's data wait counted."""
    loader = _loader()
    for _ in loader.dataset():
        loader.advance()
    stats = loader.stats()
    assert stats.steps == 16 and stats.wait_share is not None
    assert stats.stage("map_fn").records_in == 64  # type: ignore[union-attr]


def test_tensor_stages_are_timed_in_the_graph():
    """A tensor stage's calls and records are counted inside tf.data."""
    loader = ResumableLoader.from_pipeline(
        Pipeline(_DATA, seed=1).batch(4).tf_map(lambda batch, seeds: batch * 2), num_epochs=1)
    for _ in loader.dataset():
        loader.advance()
    stage = loader.stats().stage("tf_map")
    assert stage is not None and (stage.batches, stage.records_in) == (16, 64)
    assert stage.where == "tf.data" and stage.wall_s > 0


def test_tensor_stages_under_op_determinism_are_counted_not_timed():
    """TensorFlow refuses ``tf.timestamp`` under op determinism: a tensor stage still
    runs and is counted (no wall time), where it failed with "Timestamp cannot be
    called when determinism is enabled"."""
    from tensorflow.python.framework import config as tf_config

    loader = ResumableLoader.from_pipeline(
        Pipeline(_DATA, seed=1).batch(4).tf_map(lambda batch, seeds: batch * 2), num_epochs=1)
    start = loader.get_state()
    batches = []
    for batch in loader.dataset():  # built, traced and timed before determinism is on
        batches.append(batch.numpy())
        loader.advance()
    timed = loader.stats().stage("tf_map")
    assert timed is not None and timed.wall_s > 0
    tf.config.experimental.enable_op_determinism()
    try:
        loader.set_state(start)
        for batch in loader.dataset():  # the loader's reused dataset: built again
            batches.append(batch.numpy())
            loader.advance()
    finally:
        tf_config.disable_op_determinism()
    stage = loader.stats().stage("tf_map")
    assert stage is not None and (stage.batches, stage.records_in) == (32, 128)
    assert stage.wall_s == timed.wall_s  # counted, not timed, under determinism
    assert len(batches) == 32
    assert all((a == b).all() for a, b in zip(batches[:16], batches[16:], strict=True))


def test_describe_shows_the_measured_figures_and_the_bottleneck():
    """After some batches, describe() ends with the measured figures naming the bottleneck."""
    loader = _loader()
    before = loader.describe()
    assert "Measured" not in before
    _ = [b for b in loader]
    after = loader.describe()
    assert after.startswith("ResumableLoader: epoch 1") and "┌" in after
    assert "Measured since the loader was made" in after
    assert f"bottleneck: {loader.stats().bottleneck}" in after


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `directory`: tag -> [(step, value)]."""
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    number = float(tf.make_ndarray(value.tensor))
                    found.setdefault(value.tag, []).append((event.step, number))
    return found


def test_write_summaries_writes_scalars_read_back_from_the_event_files(tmp_path):
    """write_summaries(step) writes data wait and stage figures at that step, per interval.
    Each interval is 16 batches: a stage times one batch in `meters.EVERY` (8), and the
    producer runs up to a few batches ahead of the loop, so 8 batches could hold none."""
    loader = ResumableLoader(_DATA, batch_size=4, seed=1, num_epochs=2, map_fn=fns.augment)
    writer = tf.summary.create_file_writer(str(tmp_path))
    batches = iter(loader)
    for step in (1, 2):
        for _ in range(16):
            next(batches)
        loader.write_summaries(step, writer)
    writer.close()
    scalars = _scalars(tmp_path)
    assert [step for step, _ in scalars["resumeloader/data_wait_ms"]] == [1, 2]
    assert [step for step, _ in scalars["resumeloader/map_fn/ms_per_batch"]] == [1, 2]
    assert all(v > 0 for _, v in scalars["resumeloader/map_fn/allows_records_per_s"])
    assert all(v >= 0 for _, v in scalars["resumeloader/data_wait_ms"])


def test_write_summaries_refuses_a_tf_function():
    """Inside a tf.function write_summaries raises a TypeError naming it."""
    loader = _loader()

    @tf.function
    def step():
        loader.write_summaries(0)

    with pytest.raises(TypeError, match="runs eagerly only"):
        step()


def test_resume_callback_writes_the_loaders_scalars_beside_the_loss(tmp_path):
    """ResumeCallback(summaries=dir) writes the data wait scalars during fit."""
    loader = ResumableLoader(_DATA, batch_size=4, seed=1, num_epochs=2,
                             map_fn=lambda r, rng: (r, r[:1]))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = ResumeCallback(loader, tmp_path / "ckpt", summaries=tmp_path / "logs",
                              summaries_every=5)
    model.fit(epoch_dataset(loader), epochs=2, callbacks=[callback], verbose=0)
    scalars = _scalars(tmp_path / "logs")
    steps = [step for step, _ in scalars["resumeloader/data_wait_ms"]]
    assert steps and steps == sorted(steps) and steps[-1] == 32  # the optimizer's iterations
    assert "resumeloader/map_fn/ms_per_batch" in scalars


def test_resume_callback_refuses_a_summaries_of_another_type(tmp_path):
    """`summaries` must be a directory or a SummaryWriter."""
    with pytest.raises(TypeError, match="`summaries` must be"):
        ResumeCallback(_loader(), tmp_path, summaries=3)


def test_log_stats_logs_a_line_naming_the_bottleneck(caplog):
    """log_stats(every) logs the interval's summary from a daemon thread; None stops it."""
    loader = _loader()
    caplog.set_level(logging.INFO, logger="resumeloader.stats")
    loader.log_stats(0.05)
    try:
        for _ in loader:
            time.sleep(0.005)
        deadline = time.monotonic() + 30
        while not any("bottleneck" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no line logged"
            time.sleep(0.05)
    finally:
        loader.log_stats(None)
    line = next(r.getMessage() for r in caplog.records if "bottleneck" in r.getMessage())
    assert line.startswith("resumeloader: ") and "records" in line


@pytest.mark.parametrize("every", [0, -1.0, "1"], ids=["zero", "negative", "string"])
def test_log_stats_refuses_what_is_not_a_positive_number(every):
    """`every` must be a positive number of seconds (or None)."""
    with pytest.raises(ValueError, match="`every` must be a positive number"):
        _loader().log_stats(every)


def test_stats_since_is_the_interval_between_two_calls():
    """`stats.since(earlier)` counts only what happened in between."""
    loader = _loader()
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    earlier = loader.stats()
    for _ in batches:
        pass
    interval = loader.stats().since(earlier)
    assert interval.steps == 10 and interval.stage("map_fn").records_in < 64  # type: ignore[union-attr]


def test_stats_is_the_public_value_loader_stats_returns():
    """`loader.stats()` returns a `resumeloader.Stats`."""
    assert isinstance(_loader().stats(), resumeloader.Stats)


@pytest.mark.parametrize("with_metadata", [False, True], ids=["plain", "metadata"])
def test_hand_off_of_variable_leaves_counts_each_batchs_rows(with_metadata):
    """Decoding strings and ragged leaves for tf.data is the hand-off, counted per record."""
    records = [{"text": b"x" * (i % 5), "tokens": np.arange(i % 4, dtype=np.int64)}
               for i in range(30)]
    signature = {"text": tf.TensorSpec((), tf.string),
                 "tokens": tf.TensorSpec((None,), tf.int64)}
    loader = ResumableLoader(records, batch_size=4, seed=0, num_epochs=1,
                             with_metadata=with_metadata, output_signature=signature)
    for _ in loader.dataset():
        loader.advance()
    hand_off = loader.stats().stage("hand-off")
    assert hand_off is not None and (hand_off.batches, hand_off.records_in) == (8, 30)
    # `for batch in loader`: decoded and converted by the loop, each batch counted once.
    looped = ResumableLoader(records, batch_size=4, seed=0, num_epochs=1,
                             with_metadata=with_metadata, output_signature=signature)
    assert len([batch for batch in looped]) == 8
    hand_off = looped.stats().stage("hand-off")
    assert hand_off is not None and (hand_off.batches, hand_off.records_in) == (8, 30)


def test_stats_count_the_reads_of_local_files(tmp_path):
    """A loader reading local TFRecord files shows the storage layer's file reads."""
    from resumeloader.sources import TFRecordSource

    path = str(tmp_path / "part.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(40):
            writer.write(bytes([i]) * 100)
    loader = ResumableLoader.from_pipeline(
        Pipeline(TFRecordSource(path, index_dir=str(tmp_path)), seed=0).batch(8), num_epochs=1)
    _ = [batch for batch in loader]
    stats = loader.stats()
    assert stats.counts["storage.file_reads"] >= 5 and stats.counts["storage.file_bytes"] >= 4000
    assert "files: " in str(stats)


def test_for_loop_over_arrays_counts_its_stages():
    """``for batch in loader`` over arrays (chunks gathered in the loop): every stage
    counts every batch and record (the read and the batch stage a chunk of batches per
    lap, of growing sizes), the consumer every step."""
    loader = ResumableLoader(_DATA, batch_size=4, seed=1, num_epochs=2)
    batches = [b for b in loader]
    stats = loader.stats()
    by_name = {s.name: s for s in stats.stages}
    assert {"sampler", "read", "batch", "hand-off"} <= set(by_name)
    for name in ("sampler", "read", "batch", "hand-off"):
        assert (by_name[name].batches, by_name[name].records_in) == (32, 128), name
    assert by_name["batch"].bytes_out > 0  # from the timed laps
    assert stats.steps == len(batches) == 32


def test_for_loop_over_arrays_counts_growing_chunks_exactly():
    """``for batch in loader`` over arrays makes chunks of 1, 2, 4, ... 32 batches, each
    counted once: read mid-chunk and at the end, each stage's batches and records are
    those of the chunks made, the consumer's steps those handed out."""
    loader = ResumableLoader(np.arange(1002, dtype=np.int64), batch_size=4, seed=1,
                             num_epochs=1)
    batches = iter(loader)
    for _ in range(37):  # chunks of 1 + 2 + 4 + 8 + 16 batches, then 6 of the next 32
        next(batches)
    middle = loader.stats()
    assert middle.steps == 37
    assert {s.name: (s.batches, s.records_in) for s in middle.stages} == {
        name: (63, 252) for name in ("sampler", "read", "batch", "hand-off")}
    rest = [batch.shape[0] for batch in batches]
    end = loader.stats()
    assert end.steps == 37 + len(rest) == 251 and sum(rest) == 1002 - 37 * 4
    assert {s.name: (s.batches, s.records_in) for s in end.stages} == {
        name: (251, 1002) for name in ("sampler", "read", "batch", "hand-off")}
    assert end.stage("hand-off").wall_s > 0  # type: ignore[union-attr]


def test_dataset_counts_every_stage_and_step_exactly():
    """dataset() consumed with an eager advance per step: every stage counts every batch
    and record (one batch in 8 timed), the consumer every step."""
    loader = ResumableLoader(_DATA, batch_size=3, seed=1, num_epochs=1, map_fn=fns.augment)
    steps = 0
    for _ in loader.dataset():
        loader.advance()
        steps += 1
    stats = loader.stats()
    assert steps == stats.steps == 22
    for stage in stats.stages:
        assert (stage.batches, stage.records_in) == (22, 64), stage
