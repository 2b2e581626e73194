"""A Keras ``fit`` with EarlyStopping and ResumeCallback, traced for the harness by FitRecorder.

``resumeloader verify -- python tests/scripts/keras_early_stopping.py`` kills it and
restarts it: the resumed run must stop at the same epoch as the uninterrupted one
(EarlyStopping on the training loss, patience 1, best weights restored), with the
same batches and bit-identical final weights. The only verify-specific lines are the
checkpoint directory from the environment and the `FitRecorder` after the
`ResumeCallback`.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import resumeloader
import resumeloader.keras
from resumeloader.testing import FitRecorder

NUM_RECORDS, FEATURES = 40, 3
EPOCHS = 10


def source() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_RECORDS, FEATURES)).astype(np.float32)
    return {"x": x, "y": (x @ np.array([0.5, -1.0, 2.0], np.float32))[:, None]}


def augment(record: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[Any, Any]:
    x = record["x"].copy()
    x[1:] += rng.normal(scale=0.1, size=FEATURES - 1).astype(np.float32)
    return x, record["y"]


def main() -> None:
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    loader = resumeloader.ResumableLoader(source(), batch_size=6, seed=5, map_fn=augment)
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(4, activation="tanh", kernel_initializer=init(seed=1)),
        keras.layers.Dense(1, kernel_initializer=init(seed=2)),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", jit_compile=False)
    resume = resumeloader.keras.ResumeCallback(
        loader, os.environ.get("RESUMELOADER_CKPT_DIR", "checkpoints"), save_every=4
    )
    stopper = keras.callbacks.EarlyStopping(
        monitor="loss", patience=1, min_delta=0.05, restore_best_weights=True
    )
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=EPOCHS, verbose=0,
              callbacks=[stopper, resume, FitRecorder(resume)])


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
