"""resumeloader.keras on fits as people write them: compiled metrics, validation data, the
usual callbacks, interrupted in every phase of an epoch and resumed in fresh objects."""

from __future__ import annotations

import sys
from pathlib import Path

import _keras_phases as job
import _limits
import numpy as np
import pytest

from resumeloader.tools import harness

pytestmark = pytest.mark.usefixtures("clean_keras")

EPOCHS = 2
_references: dict[str, tuple] = {}


class Interrupt(Exception):
    """Raised by a hook to interrupt a fit in a phase."""


def interrupt_at(phase: str, steps: int):
    """A hook raising `Interrupt` the first time `phase` is reached after `steps` steps."""

    def hook(reached: str, done: int) -> None:
        if reached == phase and done == steps:
            raise Interrupt(f"interrupted in {phase} after {steps} steps")

    return hook


def reference(kind: str, tmp_path_factory):
    """The uninterrupted fit of `kind` (cached per test session)."""
    if kind not in _references:
        directory = tmp_path_factory.mktemp(f"reference-{kind}")
        history, weights, ends, _ = job.fit(kind, str(directory), epochs=EPOCHS)
        _references[kind] = (history, weights, ends, job.csv_rows(str(directory)))
    return _references[kind]


def interrupted_and_resumed(kind: str, directory: Path, phase: str, steps: int):
    """A fit interrupted in `phase` after `steps` steps, then resumed in fresh objects."""
    with pytest.raises(Interrupt):
        job.fit(kind, str(directory), epochs=EPOCHS, hook=interrupt_at(phase, steps))
    interrupted = job.csv_rows(str(directory)) if (directory / "log.csv").exists() else []
    return interrupted, job.fit(kind, str(directory), epochs=EPOCHS)


def assert_same_weights(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def assert_same_logs(history, want_history):
    """The resumed fit's epochs have the uninterrupted fit's logs (every metric)."""
    first = history.epoch[0]
    for key, values in history.history.items():
        assert values == want_history.history[key][first:], key
    assert set(history.history) == set(want_history.history)


@pytest.mark.parametrize("kind", job.KINDS)
def test_fit_compiled_metrics_interrupted_mid_epoch_resumes_logs_and_weights(
    tmp_path, tmp_path_factory, kind
):
    """compile(metrics=...), weighted_metrics or two outputs with metrics, validation data:
    interrupted mid-epoch and resumed, the fit has the uninterrupted batches, logs and
    weights (0.2.0 refused every such restart: 'other training metrics')."""
    want, want_weights, _, _ = reference(kind, tmp_path_factory)

    _, (history, weights, _, _) = interrupted_and_resumed(kind, tmp_path, "step", 14)

    assert history.epoch[0] == 1 and min(history.steps) == 12  # the save 4 steps into epoch 1
    assert {k: v for k, v in want.steps.items() if k >= 12} == history.steps
    assert_same_logs(history, want)
    assert_same_weights(weights, want_weights)


@pytest.mark.parametrize(
    ("phase", "steps"),
    [("step", 16), ("validation", 16), ("epoch_end", 16), ("save", 16)],
    ids=["at-its-last-batch", "during-validation", "in-another-callbacks-epoch-end",
         "during-the-checkpoint-write"],
)
def test_fit_interrupted_at_epoch_end_runs_that_epochs_end_once(
    tmp_path, tmp_path_factory, phase, steps
):
    """save_every dividing the epoch, interrupted after epoch 1's last batch (in its
    validation, another callback's on_epoch_end, the checkpoint write): the resumed fit
    runs epoch 1's validation and callbacks once, and ends as the uninterrupted fit
    (0.2.0 resumed at epoch 2: epoch 1's validation and callbacks never ran)."""
    want, want_weights, want_ends, want_rows = reference("outputs", tmp_path_factory)

    before, (history, weights, ends, _) = interrupted_and_resumed(
        "outputs", tmp_path, phase, steps
    )

    assert history.epoch == [1]
    assert [epoch for epoch, _ in ends.logs] == [1]
    assert ends.logs == want_ends.logs[1:]
    assert_same_logs(history, want)
    assert_same_weights(weights, want_weights)
    # CSVLogger's rows: a row written before the interruption is written again, identical.
    assert before == want_rows[: len(before)]
    assert job.csv_rows(str(tmp_path)) == before + want_rows[1:]


def _epochs(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """CSVLogger rows one per epoch: a row written again after a kill must be identical."""
    kept: dict[str, dict[str, str]] = {}
    for row in rows:
        assert kept.setdefault(row["epoch"], row) == row, row
    return list(kept.values())


@pytest.mark.slow
def test_verify_keras_fit_killed_in_every_phase_is_identical(tmp_path):
    """SIGKILLed at an epoch's last batch, during validation, inside another callback's
    on_epoch_end and during the epoch-end checkpoint write, restarted each time: the
    batches, final weights, stopping epoch and CSVLogger rows of the uninterrupted fit
    (two outputs, compiled metrics, EarlyStopping et al.).

    Until 0.4 it was also killed mid-epoch (``step:11``, one process more, ~6 s): a Keras
    fit SIGKILLed mid-epoch on TensorFlow is
    tests/tf/test_keras.py::test_fit_killed_by_sigkill_resumes_same_batches_and_weights
    and ::test_verify_proving_it_keras_script_killed_twice_is_identical."""
    points = ["step:15", "mark:validation:24", "mark:epoch_end:32", "save:40"]
    work = tmp_path / "verify"

    report = harness.kill_and_restart(
        [sys.executable, str(Path(job.__file__)), "outputs"], kill_points=points,
        workdir=work, timeout=_limits.PROCESS, env={"TF_CPP_MIN_LOG_LEVEL": "3"},
    )

    assert report.identical, str(report)
    # EarlyStopping ends both at epoch 5 (6 epochs of 8 steps), with the same weights.
    assert (report.reference_steps, report.resumed_steps, report.processes) == (48, 48, 5)
    assert report.weights_identical is True and report.resumed_loss == report.reference_loss
    assert [kill.resumed_at for kill in report.kills] == [12, 20, 28, 36]
    reference = job.csv_rows(str(work / "reference-ckpt"))
    assert [row["epoch"] for row in reference] == [str(e) for e in range(6)]
    assert _epochs(job.csv_rows(str(work / "resumed-ckpt"))) == reference
