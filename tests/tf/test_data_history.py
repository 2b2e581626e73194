"""The run's data history end to end: curricula, skips, lineage and replay through loaders.

Restarts here are in-process (fresh loaders restored from a JSON round trip of the
state); `test_curriculum_job_killed_before_and_after_the_change_resumes_exactly` kills
a real training job (`tests/scripts/train_curriculum.py`) with SIGKILL.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import _limits
import _worker_fns
import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader, StateMismatchError, Workers
from resumeloader.sources import TFRecordSource
from resumeloader.tools import harness

WEB = np.arange(100, 220, dtype=np.int64)
CODE = np.arange(1000, 1040, dtype=np.int64)
MATH = np.arange(5000, 5025, dtype=np.int64)
SCRIPT = Path(__file__).parents[1] / "scripts" / "train_curriculum.py"
CHANGE = 60  # the curriculum's weight change, in positions (step 15 with batches of 4)


def _base(seed: int = 3) -> Pipeline:
    return Pipeline.mix({"web": WEB, "code": CODE}, weights={"web": 3, "code": 1}, seed=seed)


def _curriculum(seed: int = 3) -> Pipeline:
    """Weights 3:1, then at CHANGE 1:1 with "math" added, then "code" removed at 150."""
    return (
        _base(seed)
        .amend(CHANGE, weights={"web": 1, "code": 1, "math": 1}, add={"math": MATH})
        .amend(150, weights={"web": 2, "code": 0, "math": 1})
    )


def _loader(pipeline: Pipeline, batch_size: int = 4, **kwargs) -> ResumableLoader:
    kwargs.setdefault("num_epochs", 2)
    return ResumableLoader.from_pipeline(pipeline.batch(batch_size), prefetch=None, **kwargs)


def _stream(loader: ResumableLoader, count: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.numpy().tolist())
        if count is not None and len(out) == count:
            break
    return out


def _restored(state: dict, pipeline: Pipeline, **kwargs) -> ResumableLoader:
    loader = _loader(pipeline, **kwargs)
    loader.set_state(json.loads(json.dumps(state)))
    return loader


def _state_after(pipeline: Pipeline, steps: int, **kwargs) -> dict:
    loader = _loader(pipeline, **kwargs)
    _stream(loader, steps) if steps else None
    return loader.get_state()


def test_curriculum_resumed_from_every_checkpoint_is_the_uninterrupted_amended_run():
    """Checkpoints of the unamended run before the change and of the amended run after
    it, each restored into the amended pipeline, continue its uninterrupted stream."""
    reference = _stream(_loader(_curriculum()))
    for step in range(len(reference) + 1):
        saved_by = _base() if step * 4 <= CHANGE else _curriculum()
        resumed = _stream(_restored(_state_after(saved_by, step), _curriculum()))
        assert resumed == reference[step:], step
    assert _stream(_loader(_base()))[: CHANGE // 4] == reference[: CHANGE // 4]


def test_curriculum_checkpoint_after_the_change_is_refused_without_it():
    """A checkpoint past the change restores into no pipeline lacking or moving it."""
    state = _state_after(_curriculum(), 20)
    moved = _base().amend(CHANGE + 4, weights={"web": 1, "code": 1, "math": 1},
                          add={"math": MATH})
    for other, named in ((_base(), "missing here: the checkpoint's mixture change at 60"),
                         (moved, "not in the checkpoint: at 64: weights")):
        with pytest.raises(StateMismatchError, match="data history differs") as raised:
            _restored(state, other)
        assert named in str(raised.value)


def test_curriculum_sources_hold_their_segment_weights_at_every_prefix():
    """In each segment every prefix holds each source's weight to within one record."""
    loader = _loader(_curriculum(), with_metadata=True, num_epochs=3)
    keys = [i for _, meta in loader for i in meta["index"].numpy().tolist()]
    names = [loader.pipeline.source.locate(k)[0] for k in keys]
    segments = [(0, CHANGE, {"web": 0.75, "code": 0.25}),
                (CHANGE, 150, {"web": 1 / 3, "code": 1 / 3, "math": 1 / 3}),
                (150, len(names), {"web": 2 / 3, "code": 0.0, "math": 1 / 3})]
    for start, stop, weights in segments:
        for n in range(1, stop - start + 1):
            part = names[start : start + n]
            for name, weight in weights.items():
                assert abs(part.count(name) - weight * n) < 1 + 1e-9, (start, n, name)


@pytest.mark.parametrize("restart_batch", [4, 6], ids=["same-batch-size", "batch-size-6"])
@pytest.mark.parametrize("saved_after", [2, 6], ids=["before-skip", "after-skip"])
def test_skip_holds_after_restarts_before_and_after_it(saved_after, restart_batch):
    """The loss-spike recipe: positions [16, 36) are skipped however the run restarts (from
    before or after the skip, with another batch size); everything else is unchanged."""
    plain = Pipeline(np.arange(40), seed=5).shuffle()
    skipped = plain.skip(16, 36)
    order = {int(m["position"].numpy()[0]) + k: int(i)
             for _, m in _loader(plain, with_metadata=True)
             for k, i in enumerate(m["index"].numpy().tolist())}
    state = _state_after(skipped, saved_after)
    saved_at = state["epoch"] * 40 + state["offset"]
    assert saved_at == (8 if saved_after == 2 else 44)
    resumed = _restored(state, skipped, batch_size=restart_batch, with_metadata=True)
    positions, indices = [], []
    for batch, meta in resumed:
        assert batch.numpy().tolist() == meta["index"].numpy().tolist()
        batch_positions = meta["position"].numpy().tolist()
        assert not (batch_positions[0] < 16 < batch_positions[-1] + 1)  # crosses no skip
        positions += batch_positions
        indices += meta["index"].numpy().tolist()
    assert positions == [p for p in range(saved_at, 80) if not 16 <= p < 36]
    assert indices == [order[p] for p in positions]


def test_skip_restored_from_a_checkpoint_taken_before_it_was_known():
    """The recipe itself: the run without the skip checkpointed at 16; the restarted run
    adds the skip from there, continues at 36; the later bad checkpoint is refused."""
    plain = Pipeline(np.arange(40), seed=5).shuffle()
    good, bad = _state_after(plain, 4), _state_after(plain, 7)
    resumed = _restored(good, plain.skip(16, 36), with_metadata=True)
    _, meta = next(iter(resumed))
    assert meta["position"].numpy().tolist() == [36, 37, 38, 39]
    with pytest.raises(StateMismatchError, match=r"skip of positions \[16, 36\)"):
        _restored(bad, plain.skip(16, 36))


def test_skip_in_a_tf_function_advances_like_the_eager_loop():
    """A graph advance jumps over the skip exactly as `for batch in loader` does."""
    pipeline = Pipeline(np.arange(40), seed=5).shuffle().skip(10, 23)
    eager = _stream(_loader(pipeline, batch_size=4))
    loader = _loader(pipeline, batch_size=4)

    @tf.function
    def run(iterator):
        for _ in tf.range(5):
            next(iterator)
            loader.advance()

    iterator = iter(loader.dataset())
    run(iterator)
    assert loader.position == loader.plan.layout.advance(0, 5) == 31  # 0, 4, 8 (short), 23, 27
    assert _stream(loader) == eager[5:]
    assert len(_loader(pipeline, batch_size=4)) == len(eager)


def _metadata(loader: ResumableLoader, count: int) -> list[tuple[list[int], list[int]]]:
    out = []
    for _, meta in loader:
        out.append((meta["position"].numpy().tolist(), meta["index"].numpy().tolist()))
        if len(out) == count:
            break
    return out


def _keys(found) -> tuple[list[int], list[int]]:
    return [r["position"] for r in found.records], [r["index"] for r in found.records]


def test_records_at_equals_metadata_for_1000_random_steps_across_a_batch_size_change():
    """For 1,000 random steps before and 1,000 after a mid-run batch-size change of an
    amended run, records_at (by step with the batch size then in force, and by
    position) is what metadata reported."""
    pipeline = _curriculum(7).skip(300, 340).amend(
        2700, weights={"web": 1, "code": 1, "math": 1})  # "code" back where it stood
    first = _loader(pipeline, batch_size=4, num_epochs=None, with_metadata=True)
    before = _metadata(first, 1200)
    second = _restored(first.get_state(), pipeline, batch_size=6, num_epochs=None,
                       with_metadata=True)
    after = _metadata(second, 1200)
    rng = random.Random(0)
    for step in rng.sample(range(1200), 1000):
        [found] = second.records_at(step, batch_size=4)
        assert _keys(found) == before[step], step
        [found] = second.records_at(positions=before[step][0][0], batch_size=4)
        assert _keys(found) == before[step], step
    for number in rng.sample(range(1200), 1000):
        [found] = second.records_at(positions=after[number][0][0])
        assert _keys(found) == after[number], number
    run = second.records_at(positions=range(after[10][0][0], after[20][0][0]))
    assert [_keys(found) for found in run] == after[10:20]


def test_records_at_equals_metadata_with_process_workers_and_names_sources():
    """With process workers, across a batch-size change, 1,000 random lookups agree with
    what metadata reported; each record names its source and lap."""
    pipeline = _curriculum(8).map(_worker_fns.augment).skip(200, 232)
    first = _loader(pipeline, with_metadata=True, num_epochs=None,
                    workers=Workers(2, kind="process"))
    with first:
        before = _metadata(first, 150)
    second = _restored(first.get_state(), pipeline, batch_size=6, with_metadata=True,
                       num_epochs=None, workers=Workers(2, kind="process"))
    with second:
        after = _metadata(second, 150)
    rng = random.Random(1)
    source = second.pipeline.source
    for _ in range(500):
        step = rng.randrange(150)
        [found] = second.records_at(step, batch_size=4)
        assert _keys(found) == before[step], step
        number = rng.randrange(150)
        [found] = second.records_at(positions=after[number][0][0])
        assert _keys(found) == after[number], number
        assert all(
            (r["source"], r["lap"], r["record"]) == source.locate(r["index"])
            for r in found.records
        )


def test_batch_at_rebuilds_a_steps_exact_bytes_on_its_own():
    """batch_at(k) is batch k byte for byte (map_fn and tensor-stage randomness included)."""
    pipeline = _curriculum(9).map(_worker_fns.augment).with_output_signature(
        tf.TensorSpec((), tf.int64)).batch(4).tf_map(
        lambda batch, seeds: batch + tf.random.stateless_uniform(
            tf.shape(seeds)[:1], seeds[0], maxval=5, dtype=tf.int64))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1, with_metadata=True)
    batches = [(b.numpy(), m["position"].numpy()) for b, m in loader]
    for step in (0, 14, 15, len(batches) - 1):
        batch, meta = loader.batch_at(step)
        assert batch.numpy().tobytes() == batches[step][0].tobytes()
        assert meta["position"].numpy().tolist() == batches[step][1].tolist()
    assert loader.position == loader.plan.layout.end  # batch_at did not move it


def test_records_at_of_a_windowed_stage_reads_its_window_and_refuses_steps_of_packing():
    """Bucketing answers steps and positions from its window; packing answers positions."""
    records = [np.arange(n % 7 + 1, dtype=np.int64) for n in range(64)]
    bucket = Pipeline(records, seed=1).shuffle().skip(16, 32).bucket_by_length(4, window=8)
    loader = ResumableLoader.from_pipeline(bucket, num_epochs=1, with_metadata=True)
    seen = [(m["position"].numpy().tolist(), m["index"].numpy().tolist()) for _, m in loader]
    assert [_keys(loader.records_at(k)[0]) for k in range(len(seen))] == seen
    packed = Pipeline(records, seed=1).shuffle().pack(12, window=16, batch_size=2)
    loader = ResumableLoader.from_pipeline(packed, num_epochs=1)
    starts, before = [], 0
    for _ in loader:  # a batch starts where the position stood before it
        starts.append(before)
        before = loader.position
    with pytest.raises(TypeError, match="by its position"):
        loader.records_at(2)
    found = loader.records_at(positions=starts)
    assert sorted(p for f in found for p in _keys(f)[0]) == list(range(64))
    assert [f.stop for f in found] == [*starts[1:], 64]
    with pytest.raises(ValueError, match="starts no batch of its window"):
        loader.records_at(positions=[starts[1] + 1])


def test_records_at_of_a_tfrecord_source_names_file_and_record(tmp_path):
    """A file source's records are named by file and record number in it."""
    paths = []
    for n in range(3):
        paths.append(str(tmp_path / f"part-{n}.tfrecord"))
        with tf.io.TFRecordWriter(paths[-1]) as writer:
            for k in range(5):
                writer.write(f"{n}:{k}".encode())
    loader = ResumableLoader.from_pipeline(
        Pipeline(TFRecordSource(paths), seed=0).shuffle().batch(4), num_epochs=1)
    [found] = loader.records_at(2)
    batch = [b.numpy().tolist() for b in loader][2]
    assert [f"{Path(r['file']).name[5]}:{r['file_record']}".encode() for r in found.records] == (
        batch
    )


def test_state_with_sixteen_amendments_is_under_one_kilobyte():
    """A loader with 16 amendments saves a state under 1 KB, and restores it."""
    pipeline = _base()
    for k in range(8):
        pipeline = pipeline.amend(10**9 + k * 10**6, weights={"web": 1 + k % 3, "code": 1})
        pipeline = pipeline.skip(2 * 10**9 + k * 10**6, 2 * 10**9 + k * 10**6 + 4096)
    loader = _loader(pipeline, num_epochs=None)
    text = loader.serialize()
    assert len(text) <= 1024, len(text)
    _loader(pipeline, num_epochs=None).deserialize(text)


@pytest.mark.slow
def test_curriculum_job_killed_before_and_after_the_change_resumes_exactly(tmp_path):
    """A real curriculum job (weights changed at step 6, a skip from step 11), SIGKILLed
    before the change and after the skip, trains on the uninterrupted run's batches."""
    report = harness.kill_and_restart(
        [sys.executable, str(SCRIPT)], kill_points=["step:3", "step:14"], workdir=tmp_path,
        timeout=_limits.PROCESS,
    )
    assert report.identical, "\n".join(report.details())
    assert report.weights_identical
    assert report.resumed_steps == report.reference_steps


def test_records_at_and_batch_at_take_numpy_integers_and_refuse_other_types():
    """Steps and positions of any integer type (NumPy's included) look up the same batch;
    a float or a str is a TypeError naming the argument and what it accepts."""
    loader = _loader(_curriculum(), num_epochs=None)
    assert loader.records_at(np.int64(3)) == loader.records_at(3)
    assert loader.records_at(positions=np.array([8, 12])) == loader.records_at(positions=[8, 12])
    by_numpy, by_int = loader.batch_at(np.int64(3)), loader.batch_at(3)
    assert by_numpy.numpy().tolist() == by_int.numpy().tolist()
    for call, name in [
        (lambda: loader.records_at(1.5), "steps"),
        (lambda: loader.records_at(positions="12"), "positions"),
        (lambda: loader.batch_at(1.5), "step"),
        (lambda: loader.batch_at(position=np.float32(8)), "position"),
    ]:
        with pytest.raises(TypeError, match=rf"^`{name}` must be a non-negative integer "
                                            r"\(Python or NumPy\)"):
            call()
