"""`FitState`: what else a resumed Keras ``fit`` needs beside model, optimizer and loader.

A ``fit`` killed mid-run and resumed from a checkpoint of model, optimizer and loader
still diverges from the uninterrupted run when callbacks decide from their own state
(`EarlyStopping`'s ``wait`` and ``best``, `ReduceLROnPlateau`'s counters,
`ModelCheckpoint`'s best value) or from training metrics that averaged the batches of
the interrupted epoch. `FitState` is checkpointed with them (a `PythonState`: a short
JSON text) and holds:

* the fields of every stateful callback of the ``fit`` (`STATEFUL`), in list order;
* the training metrics' variables, by path (mid-epoch, so a resumed epoch's logs
  average all its batches) — applied after Keras resets them at the start of the
  resumed epoch. Keras builds compiled metrics (``compile(metrics=...)``,
  ``weighted_metrics``) at the first training step, so a fresh process has only the
  loss tracker when it resumes: `build_metrics` builds them first, from the spec of
  the data ``fit`` was given, as Keras itself does under a distribution strategy;
* whether the ``fit`` was stopped by a callback (a resumed stopped ``fit`` trains no
  more).

`EarlyStopping`'s ``best_weights`` (a copy of the model's weights) are stored in
`BestWeights`, a module of variables shaped like the model's weights. `fit_callbacks`
finds the stateful callbacks of the fit a `ResumeCallback` belongs to, `fit_data_spec`
the spec of its data.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["STATEFUL", "BestWeights", "FitState", "fit_callbacks", "fit_data_spec", "stateful"]

# 2: metrics saved by path ([path, value] pairs); 1 (0.2) saved their values only.
VERSION = 2
# The callbacks whose state decides what a fit does next, and the fields that hold it.
STATEFUL: dict[type, tuple[str, ...]] = {
    keras.callbacks.EarlyStopping: ("wait", "stopped_epoch", "best", "best_epoch"),
    keras.callbacks.ReduceLROnPlateau: ("wait", "cooldown_counter", "best"),
    keras.callbacks.ModelCheckpoint: (
        "best",
        "_batches_seen_since_last_saving",
        "_last_batch_seen",
    ),
}


def stateful(callback: Any) -> tuple[str, ...] | None:
    """The fields of `callback` that a resume must restore, or None if it has none."""
    for kind, fields in STATEFUL.items():
        if isinstance(callback, kind):
            return fields
    return None


def _keeps_best_weights(callback: Any) -> bool:
    return isinstance(callback, keras.callbacks.EarlyStopping) and bool(
        callback.restore_best_weights
    )


def _encode(value: Any) -> Any:
    """A callback field as JSON: None, int, float, or a NumPy scalar with its dtype."""
    if isinstance(value, np.generic):
        return {"dtype": value.dtype.name, "value": value.item()}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    msg = f"Cannot checkpoint a callback field of type {type(value).__name__}: {value!r:.80}."
    raise TypeError(msg)


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return np.dtype(value["dtype"]).type(value["value"])
    return value


class BestWeights(tf.Module):
    """Variables holding `EarlyStopping.best_weights`, one set per such callback."""

    def __init__(self, model: Any, count: int) -> None:
        super().__init__(name="resumeloader_best_weights")
        shapes = [(np.shape(w), np.asarray(w).dtype) for w in model.get_weights()]
        self.sets = [
            [tf.Variable(np.zeros(shape, dtype), trainable=False) for shape, dtype in shapes]
            for _ in range(count)
        ]


class FitState(tf.train.experimental.PythonState):
    """The callbacks' state, the training metrics and the stop flag of a fit, as JSON.

    Args:
        model: the Keras model being fit.
        callbacks: the fit's callbacks whose state is saved (see `stateful`).
    """

    def __init__(self, model: Any, callbacks: list[Any]) -> None:
        self.model = model
        self.callbacks = callbacks
        keepers = [c for c in callbacks if _keeps_best_weights(c)]
        self.best_weights = BestWeights(model, len(keepers))
        self.stopped = False
        self.restored: dict[str, Any] | None = None

    def serialize(self) -> str:
        """The JSON text saved in the checkpoint (the callbacks' best weights are copied
        into `best_weights` as a side effect, so they are saved with it)."""
        entries = []
        keeper = 0
        for callback in self.callbacks:
            fields = stateful(callback) or ()
            entry: dict[str, Any] = {
                "class": type(callback).__name__,
                "fields": {f: _encode(getattr(callback, f, None)) for f in fields},
            }
            if _keeps_best_weights(callback):
                has = callback.best_weights is not None
                entry["best_weights"] = has
                if has:
                    for variable, value in zip(
                        self.best_weights.sets[keeper], callback.best_weights, strict=True
                    ):
                        variable.assign(value)
                keeper += 1
            entries.append(entry)
        metrics = [[v.path, np.asarray(v).tolist()] for v in self.model.metrics_variables]
        state = {"version": VERSION, "callbacks": entries, "metrics": metrics}
        state["stopped"] = self.stopped
        return json.dumps(state)

    def deserialize(self, string_value: Any) -> None:
        """Keeps the restored JSON until `apply_callbacks` and `apply_metrics`."""
        if isinstance(string_value, tf.Tensor):
            string_value = string_value.numpy()
        if isinstance(string_value, bytes):
            string_value = string_value.decode()
        self.restored = json.loads(string_value)
        self.stopped = bool(self.restored.get("stopped", False))

    def apply_callbacks(self) -> None:
        """Sets the restored fields (and best weights) on this fit's callbacks.

        Raises:
            ValueError: the checkpoint was saved by a fit with other stateful callbacks.
        """
        if self.restored is None:
            return
        saved = [entry["class"] for entry in self.restored["callbacks"]]
        here = [type(c).__name__ for c in self.callbacks]
        if saved != here:
            msg = (
                "The checkpoint holds the state of other Keras callbacks than this fit has, "
                "so they would not decide as the interrupted fit did. Pass the same stateful "
                "callbacks, in the same order, or start from a new checkpoint directory. "
                f"Received: checkpoint has {saved}, this fit has {here}."
            )
            raise ValueError(msg)
        keeper = 0
        for callback, entry in zip(self.callbacks, self.restored["callbacks"], strict=True):
            for field, value in entry["fields"].items():
                setattr(callback, field, _decode(value))
            if _keeps_best_weights(callback):
                if entry.get("best_weights"):
                    callback.best_weights = [v.numpy() for v in self.best_weights.sets[keeper]]
                keeper += 1

    def apply_metrics(self, data_spec: Any = None) -> None:
        """Sets the training metrics to their restored values (once, then forgets them).

        Compiled metrics not built yet (a fresh process) are built first, from
        `data_spec` (see `build_metrics`).

        Raises:
            ValueError: the model's metrics differ from the saved ones.
        """
        if self.restored is None or "metrics" not in self.restored:
            return
        saved = self.restored.pop("metrics")
        build_metrics(self.model, data_spec)
        variables = self.model.metrics_variables
        named = self.restored.get("version", 1) >= 2
        values = [entry[1] for entry in saved] if named else saved
        names = [entry[0] for entry in saved] if named else None
        shapes = [np.shape(value) for value in values]
        if shapes != [tuple(v.shape) for v in variables]:
            here = [f"{v.path}{list(v.shape)}" for v in variables]
            there = (
                [f"{n}{list(shape)}" for n, shape in zip(names, shapes, strict=True)]
                if names is not None else [str(list(shape)) for shape in shapes]
            )
            msg = (
                "The checkpoint holds other training metrics than this model has, so the "
                "resumed epoch's logs would not be those of the interrupted one. Compile "
                "with the same loss, metrics and weighted_metrics, or start from a new "
                f"checkpoint directory. Received: checkpoint has {there}, the model has "
                f"{here}."
            )
            raise ValueError(msg)
        for variable, value in zip(variables, values, strict=True):
            variable.assign(np.asarray(value, dtype=np.dtype(variable.dtype)))


def build_metrics(model: Any, data_spec: Any) -> None:
    """Builds `model`'s compiled metrics and losses if Keras has not yet, from the
    `tf.TypeSpec` structure of the batches ``fit`` reads (`fit_data_spec`).

    Keras builds them at the first training step from that step's data, which a
    resumed epoch's metrics must be restored before: this is the symbolic build Keras
    runs before training under a distribution strategy (``Trainer._symbolic_build``).

    Raises:
        RuntimeError: they are not built and cannot be (no data spec, or a Keras
            without the symbolic build).
    """
    unbuilt = [
        part for part in (getattr(model, "_compile_metrics", None),
                          getattr(model, "_compile_loss", None))
        if part is not None and not part.built
    ]
    if not unbuilt:
        return
    symbolic_build = getattr(model, "_symbolic_build", None)
    if data_spec is None or symbolic_build is None:
        msg = (
            "ResumeCallback cannot restore the compiled metrics of the interrupted epoch: "
            "Keras builds them at the first training step, and the spec of the data fit "
            "reads was not found to build them first. Feed fit a tf.data.Dataset (e.g. "
            f"epoch_dataset(loader)). Received: data spec {data_spec!r}, keras "
            f"{keras.__version__}."
        )
        raise RuntimeError(msg)
    strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
    with strategy.scope():
        symbolic_build(data_batch=data_spec)


def fit_data_spec(model: Any) -> Any:
    """The element spec of the dataset the running ``model.fit`` reads, or None.

    Read from the ``fit`` frame of `model` (its ``x`` argument), found a few frames up
    from a callback's ``on_train_begin``, as `fit_callbacks` finds the callbacks.
    """
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return getattr(frame.f_locals.get("x"), "element_spec", None)
        frame = frame.f_back
    return None


def fit_callbacks(resume: Any) -> list[Any]:
    """The stateful callbacks of the fit that `resume` (a ResumeCallback) is part of, in
    list order.

    Keras gives a callback no handle on the others: they are read from the
    `CallbackList` whose ``on_train_begin`` is calling `resume` (a few frames up).

    Raises:
        ValueError: a stateful callback comes after `resume`, or `resume` is combined
            with `BackupAndRestore`.
        RuntimeError: the `CallbackList` was not found (a Keras this was not made for).
    """
    frame: types.FrameType | None = sys._getframe(1)
    callbacks = None
    while frame is not None and callbacks is None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList) and any(
            c is resume for c in owner.callbacks
        ):
            callbacks = list(owner.callbacks)
        frame = frame.f_back
    if callbacks is None:
        msg = (
            "ResumeCallback could not find the other callbacks of this fit, so it cannot "
            "save their state. Call it through model.fit(callbacks=[...]). Received: "
            f"keras {keras.__version__}."
        )
        raise RuntimeError(msg)
    if any(isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks):
        msg = (
            "ResumeCallback replaces BackupAndRestore (which restarts the interrupted epoch "
            "from its first batch): pass only ResumeCallback. Received: callbacks="
            f"{[type(c).__name__ for c in callbacks]}."
        )
        raise ValueError(msg)
    index = next(i for i, c in enumerate(callbacks) if c is resume)
    late = [type(c).__name__ for c in callbacks[index + 1 :] if stateful(c)]
    if late:
        msg = (
            "Put ResumeCallback after the callbacks whose state it saves, so it saves their "
            "state once they updated it for the batch or epoch (saved before, a resumed fit "
            f"would not decide as the interrupted one). Received: {', '.join(late)} after "
            "ResumeCallback in `callbacks`."
        )
        raise ValueError(msg)
    return [c for c in callbacks[:index] if stateful(c)]
