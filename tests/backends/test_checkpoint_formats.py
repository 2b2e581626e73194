"""Where ResumeCallback keeps its checkpoints on the backend in use, and what it refuses."""

from __future__ import annotations

import os

import _keras_backends as job
import keras
import numpy as np
import pytest

import resumeloader
import resumeloader.keras
from resumeloader import errors
from resumeloader.integrations import checkpoint_layout

BACKEND = keras.backend.backend()
files_only = pytest.mark.skipif(
    BACKEND == "tensorflow", reason="the TensorFlow backend keeps tf.train.Checkpoints"
)


def fit(directory, *, model=None, epochs=1, save_every=4):
    """One short fit of fresh objects; returns the callback."""
    loader = job.make_loader()
    resume = resumeloader.keras.ResumeCallback(loader, str(directory), save_every=save_every)
    (model or job.make_model()).fit(
        resumeloader.keras.epoch_dataset(loader), epochs=epochs, callbacks=[resume], verbose=0
    )
    return resume


@files_only
def test_checkpoint_is_a_directory_of_json_and_arrays(tmp_path):
    """Each checkpoint is ``ckpt-N/`` with the loader's state as JSON (what
    get_state returned), the fit state and the variables."""
    resume = fit(tmp_path)

    newest = checkpoint_layout.checkpoints(str(tmp_path))[-1][1]
    assert sorted(os.listdir(newest)) == ["fit.json", "loader.json", "variables.npz"]
    with open(os.path.join(newest, "loader.json")) as f:
        assert f.read().startswith("{")
    assert resume.loader.get_state()["offset"] == 0 and resume.loader.epoch == 1
    assert resume.manager is None


@files_only
def test_save_killed_midway_leaves_the_previous_checkpoint_and_is_cleaned(tmp_path):
    """A hidden partial directory (a save killed before its rename) is never restored
    and the next save removes it."""
    fit(tmp_path)
    before = checkpoint_layout.checkpoints(str(tmp_path))
    partial = tmp_path / ".ckpt-99.partial-12345"
    partial.mkdir()
    (partial / "fit.json").write_text("{")

    resume = fit(tmp_path, epochs=2)

    assert resume.restored == before[-1][1]
    assert not partial.exists()


@files_only
def test_checkpoint_of_another_model_is_refused_naming_the_variable(tmp_path):
    """Restoring into a model with other variables raises StateError naming the first
    differing variable, before the loader or any variable changes."""
    fit(tmp_path)
    other = keras.Sequential([keras.Input((job.FEATURES,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    other.compile(optimizer="adam", loss="mse")

    with pytest.raises(errors.StateError, match=r"(?s)other variables.*model: .*#0"):
        fit(tmp_path, model=other)


@files_only
def test_checkpoint_manager_on_this_backend_raises_type_error():
    """A tf.train.CheckpointManager cannot save JAX or torch variables: refused at once."""
    import tensorflow as tf

    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), "unused", 1)

    with pytest.raises(TypeError, match=f"on the {BACKEND} backend"):
        resumeloader.keras.ResumeCallback(job.make_loader(), manager)


def test_directory_of_the_other_format_is_refused(tmp_path):
    """A directory holding only the other backends' checkpoints raises StateError at fit
    start instead of silently training from zero."""
    if BACKEND == "tensorflow":
        (tmp_path / "ckpt-3").mkdir()
    else:
        (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')

    with pytest.raises(errors.StateError, match="would start from zero"):
        fit(tmp_path)


def test_best_weights_of_early_stopping_survive_a_resume(tmp_path):
    """EarlyStopping's best weights saved by one fit are restored into the callback of
    the next one (bit for bit)."""
    loader = job.make_loader()
    model = job.make_model()
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=50, restore_best_weights=True)
    resume = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=2, callbacks=[stop, resume],
              verbose=0)
    again = keras.callbacks.EarlyStopping(monitor="loss", patience=50, restore_best_weights=True)
    model = job.make_model()
    resume = resumeloader.keras.ResumeCallback(job.make_loader(), str(tmp_path))
    model.fit(resumeloader.keras.epoch_dataset(resume.loader), epochs=2,
              callbacks=[again, resume], verbose=0)

    assert again.best == stop.best and again.wait == stop.wait
    for got, want in zip(again.best_weights, stop.best_weights, strict=True):
        np.testing.assert_array_equal(got, want)
