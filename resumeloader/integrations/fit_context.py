"""What a callback learns about the ``fit`` it runs in, which Keras does not hand it.

Keras gives a callback its model and ``params``, not the other callbacks of the fit
nor the data it reads. A `ResumeCallback` needs both: it saves the state of the
stateful callbacks before it (`callback_list`, `fit_callbacks`), numbers the batches
of a resumed epoch for all of them as the uninterrupted run did (`BatchNumbers`), and
builds the compiled metrics of a fresh process from the element spec of the fit's
data (`fit_data_spec`, `build_metrics`) before it restores an interrupted epoch's
metric values. Both are read from the frames of the running ``fit`` (the same on
every backend).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import keras

from resumeloader.integrations import backend

__all__ = ["BatchNumbers", "build_metrics", "callback_list", "fit_callbacks", "fit_data_spec"]


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
    if not backend.is_tensorflow():
        symbolic_build(data_batch=data_spec)
        return
    import tensorflow as tf

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


def callback_list(resume: Any) -> Any:
    """The `CallbackList` of the fit that `resume` (a callback) is part of.

    Keras gives a callback no handle on the others: it is the `CallbackList` whose
    ``on_train_begin`` is calling `resume` (a few frames up).

    Raises:
        RuntimeError: the `CallbackList` was not found (a Keras this was not made for).
    """
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList) and any(
            c is resume for c in owner.callbacks
        ):
            return owner
        frame = frame.f_back
    msg = (
        "ResumeCallback could not find the other callbacks of this fit, so it cannot "
        "save their state. Call it through model.fit(callbacks=[...]). Received: "
        f"keras {keras.__version__}."
    )
    raise RuntimeError(msg)


def fit_callbacks(resume: Any, found: Any, stateful: Callable[[Any], Any]) -> list[Any]:
    """The callbacks of `found` (the fit's `CallbackList`) before `resume` for which
    `stateful` is true, in list order.

    Raises:
        ValueError: a stateful callback comes after `resume`, or `resume` is combined
            with `BackupAndRestore`.
    """
    callbacks = list(found.callbacks)
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


class BatchNumbers:
    """Adds `offset` to the batch index a fit's `CallbackList` hands its callbacks.

    Keras numbers the batches of every epoch from 0, a resumed one too: set to the
    batches the interrupted epoch had run, the callbacks (a progress bar, your own)
    see the batch indices of the uninterrupted run. Installed on the list instance
    for one fit; `remove` takes it off.
    """

    _METHODS = ("on_train_batch_begin", "on_train_batch_end")

    def __init__(self, found: Any) -> None:
        self._list = found
        self.offset = 0
        for name in self._METHODS:
            vars(found).pop(name, None)  # a list reused by a later fit
            setattr(found, name, self._shifted(getattr(found, name)))

    def _shifted(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(batch: int, logs: Any = None) -> Any:
            return method(batch + self.offset, logs)

        return call

    def remove(self) -> None:
        """Gives the list its own methods back."""
        for name in self._METHODS:
            vars(self._list).pop(name, None)
