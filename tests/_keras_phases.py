"""A Keras fit as people write it, for the tests of resuming in every phase of an epoch.

Compiled metrics (``metrics=[...]``, ``weighted_metrics``, two outputs), validation
data, and the callbacks users put in a fit: EarlyStopping (restoring best weights),
ReduceLROnPlateau, ModelCheckpoint, CSVLogger, then the ResumeCallback saving every 4
batches (which divides the 8 batches of an epoch). Every optimizer step logs the record
ids of its batch (stored in feature 0 of every record as id / 64).

`fit` is called by the in-process tests with a `hook(phase, steps)` that raises to
interrupt the fit in a phase: ``step`` (after a step, ResumeCallback included),
``validation`` (inside the epoch's validation), ``epoch_end`` (inside the on_epoch_end
of a callback between EarlyStopping and ReduceLROnPlateau) and ``save`` (inside the
checkpoint write, its files written, the manager's index not yet updated). Run as a
script it follows the recorder contract of ``resumeloader verify`` (the phases are
``mark:NAME:k`` kill points), with checkpoints and ``log.csv`` in
``RESUMELOADER_CKPT_DIR``.
"""

from __future__ import annotations

import csv
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import resumeloader
import resumeloader.keras
from resumeloader.testing import TraceRecorder

NUM_RECORDS, FEATURES, ID_SCALE = 48, 3, 64.0
BATCH_SIZE, SAVE_EVERY = 6, 4  # 8 batches per epoch: the save due at its last batch
EPOCHS = 10
KINDS = ("accuracy", "weighted", "outputs")
Hook = Callable[[str, int], None]


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(NUM_RECORDS, dtype=np.float32) / ID_SCALE
    x = np.concatenate([ids[:, None], rng.normal(size=(NUM_RECORDS, FEATURES - 1))], 1)
    x = x.astype(np.float32)
    value = (x @ np.array([0.5, -1.0, 2.0], np.float32))[:, None]
    label = (value + 0.3 * rng.normal(size=value.shape) > 0).astype(np.float32)
    weight = (0.5 + (np.arange(NUM_RECORDS) % 3) / 2).astype(np.float32)
    return {"x": x, "label": label, "value": value, "weight": weight}


def _element(kind: str, x: Any, record: dict[str, Any]) -> Any:
    if kind == "accuracy":
        return x, record["label"]
    if kind == "weighted":
        return x, record["value"], record["weight"]
    return x, {"label": record["label"], "value": record["value"]}


def augment(kind: str, record: dict[str, np.ndarray], rng: np.random.Generator) -> Any:
    x = record["x"].copy()
    x[1:] += rng.normal(scale=0.1, size=FEATURES - 1).astype(np.float32)
    return _element(kind, x, record)


def validation_data(kind: str) -> Any:
    """The first 12 records, unaugmented, in `kind`'s structure."""
    data = {k: v[:12] for k, v in _data().items()}
    return _element(kind, data["x"], data)


class Model(keras.Model):
    """A small model whose train step logs (step, record ids) through `on_step`."""

    def __init__(self, kind: str, on_step: Callable[[int, np.ndarray], None]) -> None:
        """`on_step(step, x)` is called after each optimizer step with its features."""
        super().__init__()
        self.kind = kind
        init = keras.initializers.GlorotUniform
        self.hidden = keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1))
        self.heads = {}
        if kind != "weighted":
            self.heads["label"] = keras.layers.Dense(
                1, activation="sigmoid", kernel_initializer=init(2)
            )
        if kind != "accuracy":
            self.heads["value"] = keras.layers.Dense(1, kernel_initializer=init(3))
        self._on_step = on_step  # a plain attribute: not tracked by Keras

    def call(self, x: Any) -> Any:
        hidden = self.hidden(x)
        outputs = {name: head(hidden) for name, head in self.heads.items()}
        return outputs if self.kind == "outputs" else next(iter(outputs.values()))

    def _record(self, step: Any, x: Any) -> None:
        self._on_step(int(step), x.numpy())

    def train_step(self, data: Any) -> Any:
        logs = super().train_step(data)
        # After the update (a kill here is after the step), before any save.
        with tf.control_dependencies(tf.nest.flatten(logs)):
            tf.py_function(self._record, [self.optimizer.iterations - 1, data[0]], [])
        return logs


def ids(x: np.ndarray) -> list[int]:
    """The record ids of a batch of features."""
    return np.rint(x[:, 0] * ID_SCALE).astype(int).tolist()


def compile_options(kind: str) -> dict[str, Any]:
    if kind == "accuracy":
        return {"loss": "binary_crossentropy",
                "metrics": ["accuracy", keras.metrics.AUC(name="auc")]}
    if kind == "weighted":
        return {"loss": "mse", "metrics": ["mae"], "weighted_metrics": ["mse"]}
    return {"loss": {"label": "binary_crossentropy", "value": "mse"},
            "metrics": {"label": ["accuracy"], "value": ["mae"]}}


class Phase(keras.callbacks.Callback):
    """Calls ``hook(phase, steps done)`` in the phases of its fit it is placed for
    (``begin`` is the start of the fit, after the ResumeCallback restored)."""

    def __init__(self, hook: Hook, phases: tuple[str, ...]) -> None:
        super().__init__()
        self.hook = hook
        self.phases = phases

    def _steps(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs: Any = None) -> None:
        if "begin" in self.phases:
            self.hook("begin", self._steps())

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if "step" in self.phases:
            self.hook("step", self._steps())

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        if "validation" in self.phases:
            self.hook("validation", self._steps())

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if "epoch_end" in self.phases:
            self.hook("epoch_end", self._steps())


class EpochEnds(keras.callbacks.Callback):
    """Records the epochs whose on_epoch_end ran, and their logs."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: list[tuple[int, dict[str, float]]] = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.logs.append((epoch, {k: float(v) for k, v in (logs or {}).items()}))


def _manager_class(hook: Hook, steps: Callable[[], int]) -> type:
    class HookedManager(tf.train.CheckpointManager):
        def save(self, *args: Any, **kwargs: Any) -> str:
            options = tf.train.CheckpointOptions(
                experimental_write_callbacks=[lambda: hook("save", steps())]
            )
            path = super().save(*args, **kwargs, options=options)
            hook("saved", steps())
            return path

    return HookedManager


def fit(
    kind: str,
    directory: str,
    *,
    hook: Hook | None = None,
    epochs: int = EPOCHS,
    on_step: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[keras.callbacks.History, list[np.ndarray], EpochEnds, resumeloader.ResumableLoader]:
    """One fit of fresh objects, checkpoints and ``log.csv`` in `directory`; the History
    has the record ids of each step in ``history.steps``."""
    hook = hook or (lambda phase, steps: None)
    log: dict[int, list[int]] = {}

    def logged(step: int, x: np.ndarray) -> None:
        log[step] = ids(x)
        if on_step is not None:
            on_step(step, x)

    loader = resumeloader.ResumableLoader(
        {k: v for k, v in _data().items()}, batch_size=BATCH_SIZE, seed=5,
        map_fn=functools.partial(augment, kind),
    )
    model = Model(kind, logged)
    model.compile(optimizer=keras.optimizers.Adam(0.05), jit_compile=False,
                  **compile_options(kind))
    model(np.zeros((1, FEATURES), np.float32))
    model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, loader=loader)
    steps = lambda: int(model.optimizer.iterations.numpy())  # noqa: E731
    manager = _manager_class(hook, steps)(checkpoint, directory, max_to_keep=3)
    ends = EpochEnds()
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.002,
                                      restore_best_weights=True),
        Phase(hook, ("epoch_end",)),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1,
                                          min_delta=0.02),
        keras.callbacks.ModelCheckpoint(os.path.join(directory, "best.weights.h5"),
                                        monitor="val_loss", save_best_only=True,
                                        save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(directory, "log.csv"), append=True),
        ends,
        resumeloader.keras.ResumeCallback(loader, manager, save_every=SAVE_EVERY),
        Phase(hook, ("begin", "step", "validation")),
    ]
    history = model.fit(
        resumeloader.keras.epoch_dataset(loader), epochs=epochs, verbose=0,
        validation_data=validation_data(kind), validation_batch_size=6, callbacks=callbacks,
    )
    history.steps = log  # type: ignore[attr-defined]
    return history, model.get_weights(), ends, loader


def csv_rows(directory: str) -> list[dict[str, str]]:
    """The rows of the fit's CSVLogger file."""
    with open(os.path.join(directory, "log.csv"), newline="") as f:
        return list(csv.DictReader(f))


def main(kind: str) -> None:
    """Fit `kind` under the harness: steps traced, phases as ``mark:NAME:k`` points."""
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    recorder = TraceRecorder.from_env()

    def hook(phase: str, steps: int) -> None:
        if phase == "begin":
            recorder.start(steps)
        elif phase == "save":
            recorder.save_point()
        elif phase == "saved":
            recorder.commit(steps)
        elif phase != "step":  # a step is recorded (and paused at) by `on_step`
            recorder.mark(phase)

    def on_step(step: int, x: np.ndarray) -> None:
        recorder.step(step, x, records=ids(x))

    history, weights, _, _ = fit(
        kind, os.environ["RESUMELOADER_CKPT_DIR"], hook=hook, on_step=on_step
    )
    loss = history.history["loss"][-1] if history.epoch else None
    recorder.finish(weights=weights, loss=loss)
    recorder.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "outputs")
