"""`ResumeCallback` checkpoints as plain files (the JAX and PyTorch backends).

``tf.train.Checkpoint`` tracks only TensorFlow objects: on JAX or PyTorch a Keras
model's variables hold JAX or torch arrays, which it cannot save. There the callback
saves everything itself, through Keras' backend-neutral variables, in one directory
per checkpoint::

    DIRECTORY/ckpt-12/loader.json     the loader state (ResumableLoader.get_state)
    DIRECTORY/ckpt-12/fit.json        the fit state (FitState), what the arrays are
    DIRECTORY/ckpt-12/variables.npz   the model's variables, the optimizer's, and
                                      EarlyStopping's best weights (exact bytes)

Guarantees: a checkpoint is all or nothing. Its files are written and fsynced into
a hidden directory that is then renamed to ``ckpt-N`` (a rename is atomic): a process
killed at any moment leaves either the complete checkpoint or none, and never a
``ckpt-N`` a restore would half read. The newest ``ckpt-N`` is the one restored; the
oldest beyond `max_to_keep` are deleted after a new one is in place, and leftovers of
a killed save when the next one starts. The model, the optimizer, the loader and the
fit state are read at one moment (the end of a training step), so they agree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from resumeloader import errors
from resumeloader.integrations import backend, callback_state
from resumeloader.integrations.checkpoint_layout import (
    ARRAYS_FILE,
    FIT_FILE,
    FORMAT,
    LOADER_FILE,
    PARTIAL,
    checkpoints,
)
from resumeloader.tfdata import loader as loader_lib

__all__ = ["FileStore"]


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    with open(path, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _describe(variables: Sequence[Any]) -> list[list[Any]]:
    return [[v.path, str(np.dtype(v.dtype)), list(v.shape)] for v in variables]


def _storable(array: np.ndarray) -> np.ndarray:
    """`array` as ``.npz`` keeps it: dtypes NumPy does not know (bfloat16, float8) as
    unsigned integers of their size (their exact bytes; ``fit.json`` names the dtype)."""
    if array.dtype.isbuiltin:
        return array
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


class FileStore:
    """Model, optimizer, loader and fit state as ``ckpt-N`` directories (module doc).

    Args:
        loader: the loader whose state is saved.
        directory: where the checkpoints go.
        max_to_keep: checkpoints kept.
    """

    def __init__(
        self, loader: loader_lib.ResumableLoader, *, directory: str, max_to_keep: int = 3
    ) -> None:
        self._loader = loader
        self._directory = directory
        self._max_to_keep = max_to_keep
        self._model: Any = None
        self._fit_state: callback_state.FitState | None = None

    @property
    def directory(self) -> str:
        """The checkpoint directory."""
        return self._directory

    def _groups(self) -> dict[str, list[Any]]:
        optimizer = self._model.optimizer
        return {
            "model": list(self._model.variables),
            "optimizer": [] if optimizer is None else list(optimizer.variables),
        }

    # -- restore ---------------------------------------------------------------------
    def restore(self, model: Any, fit_state: callback_state.FitState) -> str | None:
        """Restores the newest checkpoint into model, optimizer, loader and `fit_state`.

        Returns:
            The checkpoint restored, or None when there is none yet.

        Raises:
            StateError: the newest checkpoint lacks a file, or was written for a
                model or optimizer with other variables.
            StateMismatchError: its loader state is another pipeline's.
        """
        self._model, self._fit_state = model, fit_state
        found = checkpoints(self.directory)
        if not found:
            return None
        path = found[-1][1]
        try:
            with open(os.path.join(path, LOADER_FILE)) as f:
                loader_state = f.read()
            with open(os.path.join(path, FIT_FILE)) as f:
                meta = json.load(f)
            with np.load(os.path.join(path, ARRAYS_FILE), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (OSError, ValueError) as err:
            msg = f"The checkpoint {path!r} cannot be read: {err}."
            raise errors.StateError(msg) from err
        groups = self._groups()
        self._check_variables(path, meta, groups)
        # Everything is checked before anything changes: the loader first (it validates
        # its state), then the variables.
        self._loader.set_state(loader_state)
        for group, variables in groups.items():
            saved = meta["variables"][group]
            values = [
                arrays[f"{group}/{i}"].view(np.dtype(dtype))
                for i, (_, dtype, _) in enumerate(saved)
            ]
            backend.assign(variables, values)
        fit_state.load_json(json.dumps(meta["fit"]))
        fit_state.apply_callbacks(
            lambda k: [arrays[f"best/{k}/{i}"] for i in range(meta["best_counts"][k])]
        )
        return path

    def _check_variables(
        self, path: str, meta: dict[str, Any], groups: dict[str, list[Any]]
    ) -> None:
        if meta.get("format") != FORMAT:
            msg = (
                f"The checkpoint {path!r} has format {meta.get('format')!r}; this version "
                f"of resumeloader reads format {FORMAT}."
            )
            raise errors.StateError(msg)
        differing = []
        for group, variables in groups.items():
            here, there = _describe(variables), meta["variables"].get(group, [])
            # In order, by dtype and shape: paths carry names Keras makes unique per
            # process (`dense_1` when a `dense` was made before), as the variables of a
            # tf.train.Checkpoint match by structure, not by name.
            if [v[1:] for v in here] != [v[1:] for v in there]:
                pairs = zip(here, there, strict=False)
                first = next(
                    (i for i, (a, b) in enumerate(pairs) if a[1:] != b[1:]),
                    min(len(here), len(there)),
                )
                saved = there[first] if first < len(there) else "nothing"
                found = here[first] if first < len(here) else "nothing"
                differing.append(
                    f"{group}: the checkpoint has {len(there)} variables, this one "
                    f"{len(here)}; the first that differs (#{first}): checkpoint {saved}, "
                    f"here {found}"
                )
        if differing:
            lines = "\n".join(differing)
            msg = (
                f"The checkpoint {path!r} holds other variables than this model and "
                "optimizer (build and compile the model as the run that saved it did, or "
                f"start from a new checkpoint directory):\n{lines}"
            )
            raise errors.StateError(msg)

    # -- save ------------------------------------------------------------------------
    def save(self, *, written: Callable[[], None] | None = None) -> str:
        """Writes the next checkpoint; `written` runs once its files are written and
        fsynced, before it becomes ``ckpt-N`` (see the module doc)."""
        assert self._model is not None and self._fit_state is not None
        os.makedirs(self.directory, exist_ok=True)
        self._remove_partial()
        found = checkpoints(self.directory)
        number = found[-1][0] + 1 if found else 1
        final = os.path.join(self.directory, f"ckpt-{number}")
        partial = os.path.join(self.directory, f".ckpt-{number}{PARTIAL}{os.getpid()}")
        os.mkdir(partial)
        arrays: dict[str, np.ndarray] = {}
        described: dict[str, list[list[Any]]] = {}
        for group, variables in self._groups().items():
            described[group] = _describe(variables)
            for i, value in enumerate(backend.values(variables)):
                arrays[f"{group}/{i}"] = _storable(value)
        best = self._fit_state.best_weights()
        for k, weights in enumerate(best):
            for i, value in enumerate(weights or ()):
                arrays[f"best/{k}/{i}"] = np.asarray(value)
        meta = {
            "format": FORMAT,
            "backend": backend.name(),
            "variables": described,
            "best_counts": [len(w or ()) for w in best],
            "fit": json.loads(self._fit_state.to_json()),
        }
        loader_state = json.dumps(self._loader.get_state(), sort_keys=True)
        _write(os.path.join(partial, ARRAYS_FILE), lambda f: np.savez(f, **arrays), "wb")  # type: ignore[arg-type]
        _write(os.path.join(partial, FIT_FILE), lambda f: json.dump(meta, f))
        _write(os.path.join(partial, LOADER_FILE), lambda f: f.write(loader_state))
        _fsync_directory(partial)
        if written is not None:
            written()
        os.rename(partial, final)
        _fsync_directory(self.directory)
        for _, old in found[: max(0, len(found) + 1 - self._max_to_keep)]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _remove_partial(self) -> None:
        """Leftovers of saves that were killed (a save of this process is never running)."""
        for name in os.listdir(self.directory):
            if name.startswith(".ckpt-") and PARTIAL in name:
                with contextlib.suppress(OSError):
                    shutil.rmtree(os.path.join(self.directory, name))
