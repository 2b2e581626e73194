"""Keras fit on packed batches (a batch count per epoch that only the data decides):
Keras epochs stay loader epochs, and an interrupted fit resumes exactly."""

from __future__ import annotations

import _windowed as w
import keras
import numpy as np
import pytest
import tensorflow as tf

import resumeloader.keras
from resumeloader import Pipeline, ResumableLoader

pytestmark = pytest.mark.usefixtures("clean_keras")

EPOCHS = 3
ROW = 48


def _loader() -> ResumableLoader:
    # 9, 10 and 9 batches in epochs 0, 1, 2: Keras must not learn the first count.
    pipeline = Pipeline(w.tokens(w.lengths(40, seed=9, high=30)), seed=9).shuffle()
    return ResumableLoader.from_pipeline(pipeline.pack(ROW, window=20, batch_size=2))


class _Interrupt(Exception):
    pass


class LoggedModel(keras.Model):
    """A linear model whose train step logs (step, first record of each row)."""

    def __init__(self, log: dict[int, list[int]]) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Ones())
        self._store = log.__setitem__

    def call(self, x):
        return self.dense(x)

    def _record(self, step, firsts):
        self._store(int(step), firsts.numpy().astype(int).tolist())

    def train_step(self, data):
        x, _ = data
        tf.py_function(self._record, [self.optimizer.iterations, x[:, 0]], [])
        return super().train_step(data)


class _InterruptAt(keras.callbacks.Callback):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.step:
            raise _Interrupt


def _fit(directory, log, *, interrupt_at=None, steps_per_execution=1):
    loader = _loader()
    model = LoggedModel(log)
    model(np.zeros((1, ROW), np.float32))
    model.compile(optimizer=keras.optimizers.SGD(1e-9), loss="mse",
                  steps_per_execution=steps_per_execution, jit_compile=False)
    callbacks = [resumeloader.keras.ResumeCallback(loader, directory, save_every=1)]
    if interrupt_at is not None:
        callbacks.append(_InterruptAt(interrupt_at))
    data = resumeloader.keras.epoch_dataset(loader).map(
        lambda b: (tf.cast(b["tokens"], tf.float32), tf.cast(b["segment_ids"], tf.float32))
    )
    model.fit(data, epochs=EPOCHS, callbacks=callbacks, verbose=0, shuffle=False)
    return loader, model.get_weights()


def _epochs() -> list[list[list[int]]]:
    """Each loader epoch's batches, as the first token of each row."""
    loader = _loader()
    epochs = []
    for _ in range(EPOCHS):
        batches = []
        for batch in loader.dataset(rest_of_epoch=True):
            loader.advance()
            batches.append(batch["tokens"].numpy()[:, 0].tolist())
        epochs.append(batches)
    return epochs


@pytest.mark.parametrize("steps_per_execution", [1, 2], ids=["spe1", "spe2"])
def test_fit_on_packed_batches_keras_epochs_are_loader_epochs(tmp_path, steps_per_execution):
    """Each Keras epoch trains exactly one loader epoch, however many batches it has."""
    epochs = _epochs()
    assert len({len(batches) for batches in epochs}) > 1  # the data decides each count
    log: dict[int, list[int]] = {}
    loader, _ = _fit(str(tmp_path), log, steps_per_execution=steps_per_execution)
    trained = [log[step] for step in sorted(log)]
    assert trained == [batch for batches in epochs for batch in batches]
    assert loader.epoch == EPOCHS and loader.position == EPOCHS * 40


def test_fit_on_packed_batches_interrupted_resumes_exactly(tmp_path):
    """A fit interrupted mid-epoch and resumed trains the batches of the uninterrupted fit."""
    reference: dict[int, list[int]] = {}
    _, weights = _fit(str(tmp_path / "reference"), reference)
    log: dict[int, list[int]] = {}
    with pytest.raises(_Interrupt):
        _fit(str(tmp_path / "job"), log, interrupt_at=len(reference) // 2)
    loader, resumed = _fit(str(tmp_path / "job"), log)
    assert log == reference
    assert loader.position == EPOCHS * 40
    for got, want in zip(resumed, weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_fit_on_packed_batches_with_steps_per_epoch_raises(tmp_path):
    """steps_per_epoch cannot be a packed loader's batches per epoch: refused at fit start."""
    loader = _loader()
    model = LoggedModel({})
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    data = loader.dataset().map(
        lambda b: (tf.cast(b["tokens"], tf.float32), tf.cast(b["segment_ids"], tf.float32))
    )
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    with pytest.raises(ValueError, match="pass `epoch_dataset\\(loader\\)` without") as info:
        model.fit(data, epochs=1, steps_per_epoch=3, callbacks=[callback], verbose=0,
                  shuffle=False)
    assert "steps_per_epoch=3" in str(info.value) and loader.position == 0
