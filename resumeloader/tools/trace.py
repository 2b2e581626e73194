"""`TraceRecorder`: the per-step trace a training script writes for the kill-and-restart harness.

A trace is a JSON-lines file, one event per line, appended and fsynced so that
every line written before a SIGKILL survives it:

* ``{"event": "start", "pid": P, "step": R}`` — the process started (or resumed) at
  step R, the number of steps its restored checkpoint had completed.
* ``{"event": "step", "step": k, "records": [...], "digest": "..."}`` — step k ran
  on a batch of these record ids whose bytes hash to the digest.
* ``{"event": "commit", "step": c}`` — a checkpoint holding steps ``0..c-1`` is
  durable (written after the save returned).
* ``{"event": "pause", "point": "step:17"}`` — the process stopped at the kill
  point the harness asked for and waits for its SIGKILL.
* ``{"event": "end", "step": n, "loss": L, "weights": "..."}`` — training finished.

Steps recorded after the last commit of a killed process are *uncommitted*: the
restarted process legitimately runs them again, and its records supersede them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, TextIO

import numpy as np
import optree

__all__ = ["ENV_CKPT_DIR", "ENV_PAUSE_AT", "ENV_TRACE", "Trace", "TraceRecorder", "digest"]

ENV_TRACE = "RESUMELOADER_TRACE"
ENV_PAUSE_AT = "RESUMELOADER_PAUSE_AT"
ENV_CKPT_DIR = "RESUMELOADER_CKPT_DIR"
POINT_KINDS = ("step", "commit", "save")


def digest(tree: Any) -> str:
    """A 16-hex-digit hash of the dtypes, shapes and bytes of every leaf of `tree`.

    Leaves may be NumPy arrays, numbers, or anything with ``.numpy()`` (tensors,
    variables); a string leaf is hashed by the bytes of its strings and a
    ``tf.RaggedTensor`` by its values and row partitions. Equal digests mean
    bit-identical content, in any process.

    Examples:
        >>> import numpy as np
        >>> digest([np.zeros(2, np.float32)]) == digest([np.zeros(2, np.float32)])
        True
        >>> digest([np.zeros(2, np.float32)]) == digest([np.zeros(2, np.float64)])
        False
    """
    sha = hashlib.sha256()
    for leaf in optree.tree_leaves(tree, none_is_leaf=True):
        # A ragged tensor (duck-typed: no TensorFlow import here) as its parts.
        parts = (
            [leaf.flat_values, *leaf.nested_row_splits]
            if hasattr(leaf, "nested_row_splits")
            else [leaf]
        )
        for part in parts:
            to_numpy = getattr(part, "numpy", None)
            array = np.ascontiguousarray(to_numpy() if callable(to_numpy) else np.asarray(part))
            sha.update(f"{array.dtype.str}{array.shape};".encode())
            if array.dtype == object:  # strings: their bytes, not the object pointers
                for item in array.ravel().tolist():
                    data = item.encode() if isinstance(item, str) else bytes(item)
                    sha.update(len(data).to_bytes(8, "little") + data)
            else:
                sha.update(array.tobytes())
    return sha.hexdigest()[:16]


def parse_point(point: str) -> tuple[str, int]:
    """Splits a kill point ``"kind:step"`` into its parts: kind is step, commit, save, or
    ``mark:NAME`` for a point the script marks with `TraceRecorder.mark`."""
    kind, _, number = point.rpartition(":")
    name = kind[len("mark:") :] if kind.startswith("mark:") else None
    named = name is not None and name.isidentifier() and name.isascii()
    if (kind not in POINT_KINDS and not named) or not number.isdigit():
        msg = (
            f"A kill point must be 'step:N', 'commit:N' or 'save:N', or 'mark:NAME:N' for a "
            f"point the script marks with TraceRecorder.mark(NAME), with N >= 0. "
            f"Received: {point!r}."
        )
        raise ValueError(msg)
    return kind, int(number)


class TraceRecorder:
    """Appends a training script's steps and commits to a trace file; see the module doc.

    Construct it with `from_env` in the training script: without the harness
    (``RESUMELOADER_TRACE`` unset) every method is a cheap no-op. Every event is
    flushed and fsynced before the method returns, so it survives a SIGKILL.

    When the harness sets ``RESUMELOADER_PAUSE_AT`` to ``step:k``, ``commit:k`` or
    ``save:k``, the recorder stops the process (sleeps until killed) right after
    recording step k, right after ``commit(k)``, or inside the save of the
    checkpoint after step k-1 (its files written, the manager's ``checkpoint``
    index not yet updated; needs `checkpoint_options`); at ``mark:NAME:k``, in
    ``mark(NAME)`` once k steps were recorded.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, pause_at: str | None = None):
        self._file: TextIO | None = None if path is None else open(path, "a")  # noqa: SIM115
        self._pause = parse_point(pause_at) if pause_at else None
        self._steps_done = 0

    @classmethod
    def from_env(cls) -> TraceRecorder:
        """The recorder the harness asked for, or a no-op one outside the harness."""
        return cls(os.environ.get(ENV_TRACE) or None, pause_at=os.environ.get(ENV_PAUSE_AT))

    @property
    def enabled(self) -> bool:
        """True when events are written."""
        return self._file is not None

    def _write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def _maybe_pause(self, kind: str, step: int) -> None:
        if self._file is not None and self._pause == (kind, step):
            self._write({"event": "pause", "point": f"{kind}:{step}"})
            while True:  # the harness sends SIGKILL; nothing after this line runs
                time.sleep(1.0)

    def start(self, step: int) -> None:
        """Records that the process starts at `step` (steps its checkpoint completed)."""
        self._steps_done = int(step)
        self._write({"event": "start", "pid": os.getpid(), "step": int(step)})

    def step(self, step: int, batch: Any, *, records: Any = None) -> None:
        """Records that step `step` (0-based) trained on `batch` with record ids `records`.

        Call it after the training step and before any checkpoint save that
        includes it. `batch` is any structure of arrays or tensors; only its digest
        is stored. Without `records` (ids in any array-like) the harness can still
        compare batch bytes but cannot count lost or duplicated records.
        """
        ids = [] if records is None else np.asarray(records).reshape(-1).tolist()
        self._steps_done = int(step) + 1
        self._write({"event": "step", "step": int(step), "records": ids, "digest": digest(batch)})
        self._maybe_pause("step", int(step))

    def commit(self, step: int) -> None:
        """Records that a checkpoint of steps ``0..step-1`` is durable (after the save)."""
        self._write({"event": "commit", "step": int(step)})
        self._maybe_pause("commit", int(step))

    def mark(self, name: str) -> None:
        """A named point of the training script, where the harness may kill it.

        The kill point ``mark:NAME:k`` stops the process here once k steps were
        recorded: e.g. ``recorder.mark("validation")`` in a callback's
        ``on_test_begin`` is ``mark:validation:16`` during the validation after
        step 15. Records nothing; a no-op outside the harness.
        """
        self._maybe_pause(f"mark:{name}", self._steps_done)

    def checkpoint_options(self) -> Any:
        """`tf.train.CheckpointOptions` whose write callback is the ``save:k`` pause point.

        Pass it to ``CheckpointManager.save(..., options=...)``. The callback runs
        after the checkpoint's files are written and before the manager records it
        in its ``checkpoint`` index file and deletes old checkpoints.
        """
        import tensorflow as tf

        return tf.train.CheckpointOptions(experimental_write_callbacks=[self.save_point])

    def save_point(self) -> None:
        """The ``save:k`` pause point, for checkpointing code other than a CheckpointManager.

        Call it inside your save, after the checkpoint's files are written and before
        they are made the current checkpoint; k is the number of steps recorded.
        """
        self._maybe_pause("save", self._steps_done)

    def finish(self, *, weights: Any = None, loss: float | None = None) -> None:
        """Records the end of training, a digest of the final `weights` and the `loss`."""
        self._write(
            {
                "event": "end",
                "step": self._steps_done,
                "loss": None if loss is None else float(loss),
                "weights": None if weights is None else digest(weights),
            }
        )

    def close(self) -> None:
        """Closes the trace file."""
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclasses.dataclass
class Trace:
    """The events of one process's trace file, parsed."""

    start: int | None = None
    steps: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    commits: list[int] = dataclasses.field(default_factory=list)
    end: dict[str, Any] | None = None

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Trace:
        """Parses a trace file, ignoring a torn last line (the process was killed)."""
        trace = cls()
        try:
            with open(path) as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return trace
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            trace.add(event)
        return trace

    def add(self, event: dict[str, Any]) -> None:
        """Applies one event; unknown events are ignored."""
        kind = event.get("event")
        if kind == "start":
            self.start = event["step"]
        elif kind == "step":
            self.steps[event["step"]] = event
        elif kind == "commit":
            self.commits.append(event["step"])
        elif kind == "end":
            self.end = event

    @property
    def last_step(self) -> int:
        """The highest step recorded, or -1."""
        return max(self.steps, default=-1)
