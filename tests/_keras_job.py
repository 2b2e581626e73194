"""A tiny Keras training job for the ResumeCallback tests, importable by a subprocess.

`run` trains a small model on a `ResumableLoader` with a `ResumeCallback` and returns
the batches each optimizer step consumed (record ids, logged from inside the train
step) and the final weights. Run as a script it trains with checkpoints in a
directory, optionally SIGKILLs itself after some steps, and writes its results.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import resumeloader
import resumeloader.keras

NUM_RECORDS = 40
FEATURES = 3
# Record ids are stored exactly in feature 0 as id / 64.
ID_SCALE = 64.0


def source() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(NUM_RECORDS, dtype=np.float32) / ID_SCALE
    rest = rng.normal(size=(NUM_RECORDS, FEATURES - 1)).astype(np.float32)
    x = np.concatenate([ids[:, None], rest], axis=1)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32))[:, None]
    return {"x": x, "y": y}


def augment(record: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[Any, Any]:
    x = record["x"].copy()
    x[1:] += rng.normal(scale=0.1, size=FEATURES - 1).astype(np.float32)
    return x, record["y"]


def make_loader(**overrides: Any) -> resumeloader.ResumableLoader:
    kwargs: dict[str, Any] = dict(batch_size=6, seed=5, map_fn=augment, num_epochs=None)
    kwargs.update(overrides)
    return resumeloader.ResumableLoader(source(), **kwargs)


class LoggedModel(keras.Model):
    """A two-layer regressor whose train step logs (step, record ids) of its batch."""

    def __init__(self, log: dict[int, list[int]]) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(
            4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed=1)
        )
        self.out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(2))
        self._store = log.__setitem__  # a dict attribute would be copied by Keras tracking

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))

    def _record(self, step: Any, ids: Any) -> None:
        self._store(int(step), np.rint(ids.numpy() * ID_SCALE).astype(int).tolist())

    def train_step(self, data: Any) -> Any:
        x, _ = data
        tf.py_function(self._record, [self.optimizer.iterations, x[:, 0]], [])
        return super().train_step(data)


def make_model(log: dict[int, list[int]], steps_per_execution: int = 1) -> LoggedModel:
    model = LoggedModel(log)
    model(np.zeros((1, FEATURES), np.float32))
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="mse",
        steps_per_execution=steps_per_execution,
        jit_compile=False,
    )
    return model


class Interrupt(Exception):
    """Raised by `InterruptAt` to simulate a crash."""


class InterruptAt(keras.callbacks.Callback):
    """Crashes the job once the optimizer has run `step` steps: raises, or SIGKILLs."""

    def __init__(self, step: int, *, kill: bool = False) -> None:
        super().__init__()
        self.step = step
        self.kill = kill

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if int(self.model.optimizer.iterations.numpy()) >= self.step:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise Interrupt(f"interrupted after step {self.step}")


def fit(
    directory: str,
    *,
    epochs: int,
    mode: str = "epoch-dataset",
    steps_per_execution: int = 1,
    save_every: int | None = 2,
    interrupt_at: int | None = None,
    kill: bool = False,
    validation: bool = False,
    log: dict[int, list[int]] | None = None,
    loader_options: dict[str, Any] | None = None,
    before: list[keras.callbacks.Callback] | None = None,
    history: list[keras.callbacks.History] | None = None,
) -> tuple[dict[int, list[int]], list[np.ndarray], resumeloader.ResumableLoader]:
    """One fit of a fresh model and loader; returns the step log, weights and loader.

    `before`: callbacks put before the ResumeCallback; `history` receives fit's History.
    """
    log = {} if log is None else log
    loader = make_loader(**(loader_options or {}))
    model = make_model(log, steps_per_execution)
    callbacks: list[keras.callbacks.Callback] = [
        *(before or []),
        resumeloader.keras.ResumeCallback(loader, directory, save_every=save_every),
    ]
    if interrupt_at is not None:
        callbacks.append(InterruptAt(interrupt_at, kill=kill))
    kwargs: dict[str, Any] = {}
    if mode == "epoch-dataset":
        kwargs["x"] = resumeloader.keras.epoch_dataset(loader)
    elif mode == "dataset":
        kwargs["x"] = loader.dataset()  # endless, no steps_per_epoch: the callback ends epochs
    else:
        kwargs["x"] = loader.dataset()
        kwargs["steps_per_epoch"] = loader.batches_per_epoch
    if validation:
        data = source()
        kwargs["validation_data"] = (data["x"][:8], data["y"][:8])
    result = model.fit(epochs=epochs, callbacks=callbacks, verbose=0, shuffle=False, **kwargs)
    if history is not None:
        history.append(result)
    return log, model.get_weights(), loader


def main(argv: list[str]) -> None:
    """``_keras_job.py DIRECTORY OUTPUT EPOCHS [KILL_AT]``: fit, or SIGKILL at KILL_AT."""
    directory, output, epochs = argv[0], argv[1], int(argv[2])
    kill_at = int(argv[3]) if len(argv) > 3 else None
    tf.config.experimental.enable_op_determinism()
    log, weights, loader = fit(directory, epochs=epochs, interrupt_at=kill_at, kill=True)
    result = {
        "log": {str(k): v for k, v in log.items()},
        "weights": [w.tolist() for w in weights],
        "position": loader.position,
    }
    with open(output, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
