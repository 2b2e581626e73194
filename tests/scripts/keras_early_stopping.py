"""A Keras ``fit`` with EarlyStopping and ResumeCallback that follows the recorder contract.

``resumeloader verify -- python tests/scripts/keras_early_stopping.py`` kills it and
restarts it: the resumed run must stop at the same epoch as the uninterrupted one
(EarlyStopping on the training loss, patience 1, best weights restored), with the
same batches and bit-identical final weights. Each optimizer step records its record
ids (stored in feature 0 of every record as id / 64) and batch from inside the train
step; every save of the ResumeCallback goes through a manager that marks the ``save``
pause point and commits the step after the save returned.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import resumeloader
import resumeloader.keras
from resumeloader.testing import TraceRecorder

NUM_RECORDS, FEATURES, ID_SCALE = 40, 3, 64.0
EPOCHS = 10


def source() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(NUM_RECORDS, dtype=np.float32) / ID_SCALE
    x = np.concatenate([ids[:, None], rng.normal(size=(NUM_RECORDS, 2)).astype(np.float32)], 1)
    return {"x": x, "y": (x @ np.array([0.5, -1.0, 2.0], np.float32))[:, None]}


def augment(record: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[Any, Any]:
    x = record["x"].copy()
    x[1:] += rng.normal(scale=0.1, size=FEATURES - 1).astype(np.float32)
    return x, record["y"]


class TracedModel(keras.Model):
    """A small regressor whose train step records (step, record ids, batch)."""

    def __init__(self, recorder: TraceRecorder) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(
            4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed=1)
        )
        self.out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))
        self._recorder = recorder

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))

    def _record(self, step: Any, x: Any, y: Any) -> None:
        ids = np.rint(x.numpy()[:, 0] * ID_SCALE).astype(int)
        self._recorder.step(int(step), (x.numpy(), y.numpy()), records=ids)

    def train_step(self, data: Any) -> Any:
        x, y = data
        logs = super().train_step(data)
        # After the update (so a pause here is after the step), before any save.
        with tf.control_dependencies(tf.nest.flatten(logs)):
            tf.py_function(self._record, [self.optimizer.iterations - 1, x, y], [])
        return logs


def main() -> None:
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    recorder = TraceRecorder.from_env()
    loader = resumeloader.ResumableLoader(source(), batch_size=6, seed=5, map_fn=augment)
    model = TracedModel(recorder)
    model(np.zeros((1, FEATURES), np.float32))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, loader=loader)

    class TracedManager(tf.train.CheckpointManager):
        def save(self, *args: Any, **kwargs: Any) -> str:
            path = super().save(*args, **kwargs, options=recorder.checkpoint_options())
            recorder.commit(int(model.optimizer.iterations.numpy()))
            return path

    manager = TracedManager(checkpoint, os.environ["RESUMELOADER_CKPT_DIR"], max_to_keep=3)
    start = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: recorder.start(int(model.optimizer.iterations.numpy()))
    )
    stopper = keras.callbacks.EarlyStopping(
        monitor="loss", patience=1, min_delta=0.05, restore_best_weights=True
    )
    history = model.fit(
        resumeloader.keras.epoch_dataset(loader),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[stopper, resumeloader.keras.ResumeCallback(loader, manager, save_every=4),
                   start],
    )
    loss = history.history["loss"][-1] if history.epoch else None
    recorder.finish(weights=model.weights, loss=loss)
    recorder.close()


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
