"""A Keras ``fit`` whose batches are made on a Dask cluster, following the recorder contract.

``resumeloader verify -- python tests/scripts/keras_dask.py`` SIGKILLs it and restarts
it: each process connects to the scheduler at ``$RESUMELOADER_TEST_DASK_ADDRESS``
(without it, ``Workers(2, kind="dask")`` starts a local cluster per process), trains 3
epochs of a small regressor on augmented records (``map_fn`` defined here, in
``__main__``: it travels to the workers by value) with a `ResumeCallback`, and records
every optimizer step's record ids and batch from inside the train step.
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

NUM_RECORDS, FEATURES, ID_SCALE, EPOCHS = 40, 3, 64.0, 3


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
        with tf.control_dependencies(tf.nest.flatten(logs)):
            tf.py_function(self._record, [self.optimizer.iterations - 1, x, y], [])
        return logs


def main() -> None:
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    recorder = TraceRecorder.from_env()
    address = os.environ.get("RESUMELOADER_TEST_DASK_ADDRESS")
    where = resumeloader.DaskOptions(address=address)
    workers = (
        resumeloader.Workers(kind="dask", options=where) if address
        else resumeloader.Workers(2, kind="dask")
    )
    pipeline = resumeloader.Pipeline(source(), seed=5).shuffle().map(augment).batch(6)
    loader = resumeloader.ResumableLoader.from_pipeline(pipeline, workers=workers)
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
    history = model.fit(
        resumeloader.keras.epoch_dataset(loader),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[resumeloader.keras.ResumeCallback(loader, manager, save_every=4), start],
    )
    recorder.finish(weights=model.weights, loss=history.history["loss"][-1])
    recorder.close()
    loader.close()


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
