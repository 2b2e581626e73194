"""ResumeCallback on the Keras backend in use: a fit interrupted (an exception, real
SIGKILLs in every phase of an epoch) resumes with the uninterrupted run's batches,
bit-identical weights, logged metrics and batch numbers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import _keras_backends as job
import keras
import numpy as np
import pytest

import resumeloader
import resumeloader.keras
from resumeloader import testing
from resumeloader.integrations import backend

BACKEND = keras.backend.backend()
ROOT = Path(__file__).resolve().parents[2]
# PyTorch's trainer runs one step per execution only; JAX runs several (the code it
# shares with PyTorch is the same), TensorFlow's are tested in tests/tf/test_keras.py.
STEPS_PER_EXECUTION = {"torch": 1, "jax": 2}.get(BACKEND, 1)
_references: dict[tuple[str, int], tuple] = {}


class Interrupt(Exception):
    """Stands in for a crash."""


class InterruptAt(keras.callbacks.Callback):
    """Raises `Interrupt` once the optimizer ran `step` steps."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        [iterations] = backend.values([self.model.optimizer.iterations])
        if int(iterations) >= self.step:
            raise Interrupt(f"interrupted after step {self.step}")


def reference(tmp_path_factory, steps_per_execution: int):
    """The uninterrupted fit (cached per session)."""
    key = (BACKEND, steps_per_execution)
    if key not in _references:
        directory = tmp_path_factory.mktemp("reference")
        history, weights, loader = job.fit(str(directory),
                                           steps_per_execution=steps_per_execution)
        _references[key] = (history, weights, directory, loader.position)
    return _references[key]


@pytest.mark.parametrize("steps_per_execution", [STEPS_PER_EXECUTION])
def test_fit_interrupted_mid_epoch_resumes_weights_logs_and_batch_numbers(
    tmp_path, tmp_path_factory, steps_per_execution
):
    """Interrupted 14 steps in (epoch 1) and resumed in fresh objects: the fit ends with
    the uninterrupted weights (bit for bit), the same logs of every epoch, and its
    callbacks saw the resumed epoch's batches numbered as in the uninterrupted run."""
    want, want_weights, want_dir, want_position = reference(tmp_path_factory,
                                                            steps_per_execution)

    with pytest.raises(Interrupt):
        job.fit(str(tmp_path), steps_per_execution=steps_per_execution,
                extra=(InterruptAt(14),))
    history, weights, loader = job.fit(str(tmp_path), steps_per_execution=steps_per_execution)

    assert history.epoch[0] == 1  # resumed inside epoch 1, from the save 4 steps into it
    for key, values in history.history.items():
        assert values == want.history[key][1:], key
    for got, expected in zip(weights, want_weights, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert job.csv_rows(str(tmp_path)) == job.csv_rows(str(want_dir))
    assert job.batches_seen(str(tmp_path)) == job.batches_seen(str(want_dir))
    assert loader.position == want_position


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow: tests/tf/test_keras_phases.py "
                    "kills a fit in every phase (the TensorFlow checkpoint format)")
def test_fit_killed_in_every_phase_is_identical(tmp_path):
    """SIGKILLed mid-epoch and in one more phase of an epoch (on JAX inside a checkpoint
    write, on PyTorch at an epoch's end), and restarted each time, the fit trains on the
    uninterrupted batches and ends with its weights, logs (every epoch's metrics) and
    batch numbers.

    The phases are split between the two backends (until 0.4 each was killed in all of
    them: 11 processes, then 9, now 7; each step ~15 s of CPU less): the callbacks that act
    in a phase and the checkpoint files are the same code on JAX and PyTorch, each
    backend's own fit loop is still SIGKILLed mid-epoch and in a phase, and TensorFlow is
    killed in every phase, during validation too (tests/tf/test_keras_phases.py)."""
    command = [sys.executable, str(ROOT / "tests" / "_keras_backends.py"),
               str(STEPS_PER_EXECUTION)]
    # The checkpoint files are written by the same code on JAX and PyTorch: one kill
    # inside a write (on JAX) covers both.
    points = ["step:5", "save:28"] if BACKEND == "jax" else ["step:5", "mark:epoch_end:24"]

    report = testing.kill_and_restart(
        command, kill_points=points, workdir=tmp_path, timeout=600,
        env={"KERAS_BACKEND": BACKEND,
             "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), *sys.path])},
    )

    assert report.identical, str(report)
    assert report.weights_identical
    reference, resumed = str(tmp_path / "reference-ckpt"), str(tmp_path / "resumed-ckpt")
    assert job.csv_rows(resumed) == job.csv_rows(reference)
    assert job.batches_seen(resumed) == job.batches_seen(reference)


def test_fit_dataset_with_steps_per_epoch_resumes_exactly(tmp_path, tmp_path_factory):
    """Fed ``loader.dataset()`` with ``steps_per_epoch=loader.batches_per_epoch``, a fit
    interrupted mid-epoch resumes with the weights of the uninterrupted one."""

    def fit(directory, extra=()):
        keras.utils.set_random_seed(0)
        loader = job.make_loader()
        model = job.make_model()
        callbacks = [resumeloader.keras.ResumeCallback(loader, directory, save_every=3), *extra]
        model.fit(loader.dataset(), steps_per_epoch=loader.batches_per_epoch, epochs=2,
                  callbacks=callbacks, verbose=0)
        return model.get_weights(), loader

    want, _ = fit(str(tmp_path_factory.mktemp("reference")))
    with pytest.raises(Interrupt):
        fit(str(tmp_path), extra=(InterruptAt(10),))
    got, loader = fit(str(tmp_path))

    assert loader.position == 2 * job.NUM_RECORDS
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_resume_callback_keeps_the_latest_checkpoints(tmp_path):
    """``max_to_keep=2``: after many saves only the two newest checkpoints are left, and
    a fresh fit resumes from the newest one."""
    loader = job.make_loader()
    model = job.make_model()
    resume = resumeloader.keras.ResumeCallback(loader, str(tmp_path), save_every=1,
                                               max_to_keep=2)
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=1, callbacks=[resume],
              verbose=0)

    names = {name.split(".")[0] for name in os.listdir(tmp_path) if name.startswith("ckpt-")}
    assert len(names) == 2
    newest = max(int(name.split("-")[1]) for name in names)
    again = resumeloader.keras.ResumeCallback(job.make_loader(), str(tmp_path))
    job.make_model().fit(resumeloader.keras.epoch_dataset(again.loader), epochs=1,
                         callbacks=[again], verbose=0)
    assert again.restored is not None
    assert again.restored.endswith(f"ckpt-{newest}")
