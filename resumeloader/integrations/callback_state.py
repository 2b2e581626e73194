"""`FitState`: what else a resumed Keras ``fit`` needs beside model, optimizer and loader.

A ``fit`` killed mid-run and resumed from a checkpoint of model, optimizer and loader
still diverges from the uninterrupted run when callbacks decide from their own state
(`EarlyStopping`'s ``wait`` and ``best``, `ReduceLROnPlateau`'s counters,
`ModelCheckpoint`'s best value) or from training metrics that averaged the batches of
the interrupted epoch. `FitState` is checkpointed with them, as a short JSON text, and
holds:

* the fields of every stateful callback of the ``fit`` (`STATEFUL`), in list order;
* the training metrics' variables, by path (mid-epoch, so a resumed epoch's logs
  average all its batches) — applied after Keras resets them at the start of the
  resumed epoch. Keras builds compiled metrics (``compile(metrics=...)``,
  ``weighted_metrics``) at the first training step on TensorFlow, so a fresh process
  has only the loss tracker when it resumes: the callback builds them first
  (`resumeloader.integrations.fit_context.build_metrics`);
* whether the ``fit`` was stopped by a callback (a resumed stopped ``fit`` trains no
  more).

`EarlyStopping`'s ``best_weights`` (a copy of the model's weights) are arrays beside
the JSON (`best_weights`, `apply_callbacks`); each checkpoint format stores them its
own way. Nothing here depends on the Keras backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from resumeloader.integrations import backend

__all__ = ["STATEFUL", "FitState", "stateful"]

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


def keeps_best_weights(callback: Any) -> bool:
    """True for an `EarlyStopping` that restores its best weights (it holds a copy)."""
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


class FitState:
    """The callbacks' state, the training metrics and the stop flag of a fit, as JSON.

    Args:
        model: the Keras model being fit.
        callbacks: the fit's callbacks whose state is saved (see `stateful`).
    """

    def __init__(self, model: Any, callbacks: list[Any]) -> None:
        self.model = model
        self.callbacks = callbacks
        self.stopped = False
        # Batches of the running Keras epoch consumed when saved (its numbering on resume).
        self.epoch_batches: int | None = 0
        self.restored: dict[str, Any] | None = None

    @property
    def keepers(self) -> list[Any]:
        """The callbacks holding best weights (`EarlyStopping(restore_best_weights=True)`)."""
        return [c for c in self.callbacks if keeps_best_weights(c)]

    def to_json(self) -> str:
        """The JSON text saved in the checkpoint (the best weights are not in it)."""
        entries = []
        for callback in self.callbacks:
            fields = stateful(callback) or ()
            entry: dict[str, Any] = {
                "class": type(callback).__name__,
                "fields": {f: _encode(getattr(callback, f, None)) for f in fields},
            }
            if keeps_best_weights(callback):
                entry["best_weights"] = callback.best_weights is not None
            entries.append(entry)
        variables = self.model.metrics_variables
        metrics = [
            [v.path, value.tolist()]
            for v, value in zip(variables, backend.values(variables), strict=True)
        ]
        state = {"version": VERSION, "callbacks": entries, "metrics": metrics}
        state["stopped"] = self.stopped
        state["epoch_batches"] = self.epoch_batches
        return json.dumps(state)

    def best_weights(self) -> list[list[np.ndarray] | None]:
        """Each keeper's best weights (None while it has none), in list order."""
        return [
            None if c.best_weights is None else [np.asarray(w) for w in c.best_weights]
            for c in self.keepers
        ]

    def load_json(self, text: str | bytes) -> None:
        """Keeps the restored JSON until `apply_callbacks` and `apply_metrics`."""
        if isinstance(text, bytes):
            text = text.decode()
        self.restored = json.loads(text)
        self.stopped = bool(self.restored.get("stopped", False))
        # None in checkpoints of resumeloader 0.3 and earlier.
        self.epoch_batches = self.restored.get("epoch_batches")

    def apply_callbacks(self, best_weights: Callable[[int], list[np.ndarray]]) -> None:
        """Sets the restored fields on this fit's callbacks, and their best weights.

        Args:
            best_weights: the saved best weights of the `k`-th keeper, called only
                for a keeper that had some.

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
            if keeps_best_weights(callback):
                if entry.get("best_weights"):
                    callback.best_weights = best_weights(keeper)
                keeper += 1

    @property
    def pending_metrics(self) -> bool:
        """True while restored metric values wait for `apply_metrics`."""
        return self.restored is not None and "metrics" in self.restored

    def apply_metrics(self) -> None:
        """Sets the training metrics to their restored values (once, then forgets them).

        The model's compiled metrics must be built (`fit_context.build_metrics`).

        Raises:
            ValueError: the model's metrics differ from the saved ones.
        """
        if self.restored is None or "metrics" not in self.restored:
            return
        saved = self.restored.pop("metrics")
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
        backend.assign(variables, values)
