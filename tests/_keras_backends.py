"""A Keras fit as people write it, the same on every Keras backend (``KERAS_BACKEND``).

Compiled metrics, validation data, dropout (a seed generator's state) and batch
normalization (non-trainable variables), EarlyStopping restoring best weights,
ReduceLROnPlateau, CSVLogger, then the ResumeCallback saving every 4 batches and a
`FitRecorder`: run as a script it follows the recorder contract of ``resumeloader
verify``, with checkpoints, ``log.csv`` and ``batches.txt`` (the ``epoch batch``
index every batch callback saw) in ``RESUMELOADER_CKPT_DIR``. `fit` is also called
in-process by the backend tests (tests/backends/).
"""

from __future__ import annotations

import csv
import os
import sys
from typing import Any

import keras
import numpy as np

import resumeloader
import resumeloader.keras
from resumeloader.testing import FitRecorder

NUM_RECORDS, FEATURES, ID_SCALE = 48, 3, 64.0
BATCH_SIZE, SAVE_EVERY = 6, 4  # 8 batches per epoch
EPOCHS = 5


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(NUM_RECORDS, dtype=np.float32) / ID_SCALE
    x = np.concatenate([ids[:, None], rng.normal(size=(NUM_RECORDS, FEATURES - 1))], 1)
    x = x.astype(np.float32)
    value = x @ np.array([0.5, -1.0, 2.0], np.float32)
    label = (value + 0.3 * rng.normal(size=value.shape) > 0).astype(np.float32)[:, None]
    return {"x": x, "label": label}


def augment(record: dict[str, np.ndarray], rng: np.random.Generator) -> Any:
    x = record["x"].copy()
    x[1:] += rng.normal(scale=0.1, size=FEATURES - 1).astype(np.float32)
    return x, record["label"]


def make_loader() -> resumeloader.ResumableLoader:
    return resumeloader.ResumableLoader(data(), batch_size=BATCH_SIZE, seed=5, map_fn=augment)


def make_model(steps_per_execution: int = 1) -> keras.Model:
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1)),
        keras.layers.Dropout(0.2, seed=3),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1, activation="sigmoid", kernel_initializer=init(2)),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc")],
                  steps_per_execution=steps_per_execution)
    return model


class BatchLog(keras.callbacks.Callback):
    """Appends ``epoch batch`` to a file for every training batch its callbacks saw."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        with open(self.path, "a") as f:
            f.write(f"{self.epoch} {batch}\n")


def fit(
    directory: str,
    *,
    epochs: int = EPOCHS,
    steps_per_execution: int = 1,
    extra: tuple[keras.callbacks.Callback, ...] = (),
) -> tuple[keras.callbacks.History, list[np.ndarray], resumeloader.ResumableLoader]:
    """One fit of fresh objects, checkpoints and logs in `directory`."""
    keras.utils.set_random_seed(0)
    os.makedirs(directory, exist_ok=True)
    loader = make_loader()
    model = make_model(steps_per_execution)
    resume = resumeloader.keras.ResumeCallback(loader, directory, save_every=SAVE_EVERY)
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=0.001,
                                      restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1,
                                          min_delta=0.01),
        keras.callbacks.CSVLogger(os.path.join(directory, "log.csv"), append=True),
        BatchLog(os.path.join(directory, "batches.txt")),
        resume,
        FitRecorder(resume),
        *extra,
    ]
    validation = data()
    history = model.fit(
        resumeloader.keras.epoch_dataset(loader), epochs=epochs, verbose=0,
        validation_data=(validation["x"][:12], validation["label"][:12]),
        validation_batch_size=6, callbacks=callbacks,
    )
    return history, [np.asarray(w) for w in model.get_weights()], loader


def csv_rows(directory: str) -> dict[str, dict[str, str]]:
    """The CSVLogger rows by epoch (the last row of an epoch written twice)."""
    with open(os.path.join(directory, "log.csv"), newline="") as f:
        return {row["epoch"]: row for row in csv.DictReader(f)}


def batches_seen(directory: str) -> set[tuple[int, int]]:
    """The (epoch, batch) indices the callbacks saw."""
    with open(os.path.join(directory, "batches.txt")) as f:
        return {tuple(map(int, line.split())) for line in f}  # type: ignore[misc]


def determinism() -> None:
    """Bit-identical runs on the backend in use."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    elif keras.backend.backend() == "torch":
        import torch

        torch.use_deterministic_algorithms(True)


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    determinism()
    fit(os.environ["RESUMELOADER_CKPT_DIR"],
        steps_per_execution=int(sys.argv[1]) if len(sys.argv) > 1 else 1)
