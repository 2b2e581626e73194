"""The restore bugs of TensorFlow input pipelines, and that ResumableLoader has none of them.

A run trains, checkpoints (every step or every 3 steps), crashes, restores from its
last checkpoint into the same or a fresh loader and finishes; the stream of record
ids it saw must equal the uninterrupted stream exactly, including the epoch after the
resumed one. The grid consumes ``loader.dataset()`` through a TF map and calls
``advance()``; a second grid consumes ``for batch in loader`` (its prefetch thread).
Beside them, the naive split pipeline (README, "Why") is shown losing records.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import _limits
import _pipelines
import numpy as np
import pytest
import tensorflow as tf

import resumeloader

GRID = _pipelines.grid()


@pytest.mark.parametrize("case", GRID, ids=[case.id for case in GRID])
def test_resume_after_crash_equals_uninterrupted_stream(case, tmp_path):
    """The resumed stream of record ids equals the uninterrupted one, batch for batch."""
    expected, observed = _pipelines.run_case(case, tmp_path)

    assert observed == expected


ARRAY_GRID = _pipelines.array_grid()


@pytest.mark.parametrize("case", ARRAY_GRID, ids=[case.id for case in ARRAY_GRID])
def test_resume_of_array_source_after_crash_equals_uninterrupted_stream(case, tmp_path):
    """An array source, whose batches tf.data gathers, resumes to the uninterrupted stream."""
    expected, observed = _pipelines.run_case(case, tmp_path)

    assert observed == expected


LOOP_GRID = _pipelines.loop_grid()


@pytest.mark.parametrize("case", LOOP_GRID, ids=[case.id for case in LOOP_GRID])
def test_resume_of_for_loop_after_crash_equals_uninterrupted_stream(case, tmp_path):
    """`for batch in loader` with its prefetch thread resumes to the uninterrupted stream."""
    expected, observed = _pipelines.run_case(case, tmp_path)

    assert observed == expected


@pytest.mark.parametrize("cases", [GRID, ARRAY_GRID], ids=["records-grid", "array-grid"])
def test_grid_covers_every_pair_of_axis_values(cases):
    """Every pair of values of any two grid axes occurs in at least one case."""
    axes = ("batch_size", "prefetch", "parallel_calls", "checkpoint_every", "interruption")
    axes += ("fresh_loader",)
    values = {axis: {getattr(case, axis) for case in cases} for axis in axes}
    missing = [
        (a, x, b, y)
        for i, a in enumerate(axes)
        for b in axes[i + 1 :]
        for x in values[a]
        for y in values[b]
        if not any(getattr(c, a) == x and getattr(c, b) == y for c in cases)
    ]

    assert missing == []
    assert values["interruption"] == set(_pipelines.INTERRUPTIONS)
    assert values["fresh_loader"] == {False, True}


def test_grid_spans_the_required_batch_sizes_and_prefetches():
    """The main grid runs batch sizes 1, 4, 7 and prefetch none, 1, 2 and AUTOTUNE."""
    assert {case.batch_size for case in GRID} == {1, 4, 7}
    assert {case.prefetch for case in GRID} == {None, 1, 2, tf.data.AUTOTUNE}
    assert {case.parallel_calls for case in GRID} == {1, tf.data.AUTOTUNE}
    assert {case.checkpoint_every for case in GRID} == {1, 3}


_DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()
    import _pipelines
    cases = _pipelines.grid(batch_sizes=(7,), prefetches=(None, _pipelines.AUTOTUNE))
    cases += _pipelines.array_grid()[:4]
    failures = []
    for case in cases:
        expected, observed = _pipelines.run_case(case, Path(tempfile.mkdtemp()))
        if observed != expected:
            failures.append(case.id)
    print(json.dumps({"cases": len(cases), "failures": failures}))
    """
)


@pytest.mark.slow
def test_resume_with_op_determinism_equals_uninterrupted_stream():
    """With enable_op_determinism (a fresh process: it cannot be undone) a reduced grid holds."""
    tests_dir = Path(__file__).resolve().parents[1]  # where _pipelines.py is
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(tests_dir))
    result = subprocess.run(
        [sys.executable, "-c", _DETERMINISM_SCRIPT],
        cwd=tests_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=_limits.PROCESS,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == []
    assert report["cases"] == 2 * 2 * 2 + 4


def test_naive_split_pipeline_loses_records_on_restore(tmp_path):
    """The split workaround's checkpoint resumes past records training never consumed."""
    lost = [
        _pipelines.naive_records_lost(
            tmp_path / str(seed), batch_size=4, steps=3, seed=seed, step_seconds=0.02
        )
        for seed in range(3)
    ]

    assert sum(lost) > 0, lost


def test_loader_under_naive_pipeline_conditions_loses_nothing(tmp_path):
    """Same read-ahead as the naive pipeline (batch 4, prefetch, slow steps): nothing lost."""
    loader = resumeloader.ResumableLoader(
        np.arange(50), batch_size=4, seed=0, num_epochs=1, prefetch=tf.data.AUTOTUNE
    )
    checkpoint = tf.train.Checkpoint(loader=loader)
    consumed = []
    for batch in itertools.islice(loader.dataset(), 3):
        time.sleep(0.02)  # a slow training step: tf.data prefetches ahead meanwhile
        consumed += batch.numpy().tolist()
        loader.advance()
    path = checkpoint.write(str(tmp_path / "ckpt"))
    fresh = resumeloader.ResumableLoader(np.arange(50), batch_size=4, seed=0, num_epochs=1)
    tf.train.Checkpoint(loader=fresh).read(path).assert_consumed()
    rest = [i for batch in fresh for i in batch.numpy().tolist()]

    assert consumed + rest == resumeloader.IndexSampler(50, seed=0).indices(0, 50).tolist()


@pytest.mark.parametrize(
    "experimental_relaxed",
    [False, True],
    ids=["default-options", "external-state-ignore"],
)
def test_checkpoint_of_from_generator_iterator_fails(experimental_relaxed, tmp_path):
    """tf.train.Checkpoint cannot save an iterator over from_generator: the reason to split."""
    ds = tf.data.Dataset.from_generator(
        lambda: iter(range(10)), output_signature=tf.TensorSpec((), tf.int64)
    )
    if experimental_relaxed:
        options = tf.data.Options()
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        ds = ds.with_options(options)
    iterator = iter(ds)
    next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)

    with pytest.raises((tf.errors.FailedPreconditionError, tf.errors.UnimplementedError)) as info:
        checkpoint.write(str(tmp_path / "ckpt"))

    assert "stateful" in str(info.value) or "does not support checkpointing" in str(info.value)
