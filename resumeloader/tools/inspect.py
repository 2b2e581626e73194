"""``resumeloader inspect``: the loader states stored in a TF checkpoint, without user code.

A `ResumableLoader` is a ``PythonState``; ``tf.train.Checkpoint`` stores its JSON
under a key ending in ``/.ATTRIBUTES/py_state``. Every such value whose JSON has
resumeloader's ``version`` and ``fingerprint`` fields is a loader state.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from resumeloader import errors
from resumeloader.core import state as state_lib

__all__ = ["find_states", "main", "printable"]

_SUFFIX = "/.ATTRIBUTES/py_state"
_GLOB_CHARACTERS = re.compile(r"[\[\]*?]")


def _resolve(path: str) -> str:
    """The checkpoint prefix of a directory (from its index file), or `path` itself."""
    import tensorflow as tf

    if not os.path.isdir(path):
        return path
    index = os.path.join(path, "checkpoint")
    if not os.path.isfile(index):
        msg = f"No checkpoint found in directory {path!r} (no `checkpoint` index file)."
        raise ValueError(msg)
    cause: Exception | None = None
    try:
        # Reads the index file as it is: unlike tf.train.latest_checkpoint, no glob.
        state = tf.train.get_checkpoint_state(path)
    except (ValueError, UnicodeDecodeError, tf.errors.OpError) as err:
        state, cause = None, err
    if state is None or not state.model_checkpoint_path:
        why = f": {cause}" if cause is not None else ""
        msg = (
            f"The checkpoint index file {index!r} cannot be read as the one "
            f"tf.train.CheckpointManager writes{why}. Pass a checkpoint prefix instead "
            f"(e.g. {os.path.join(path, 'ckpt-1')!r})."
        )
        raise ValueError(msg) from cause
    # A relative name in the index is already joined to `path` by TensorFlow.
    prefix = str(state.model_checkpoint_path)
    if not os.path.isfile(prefix + ".index"):
        msg = (
            f"The checkpoint index file {index!r} names the checkpoint {prefix!r}, but "
            f"{prefix + '.index'!r} does not exist (deleted or moved?). Pass an existing "
            "checkpoint prefix instead."
        )
        raise ValueError(msg)
    return prefix


@contextlib.contextmanager
def _plain_prefix(prefix: str) -> Iterator[str]:
    """`prefix`, or links to its files under a plain name while it contains ``[*?``.

    TensorFlow matches a checkpoint prefix as a glob pattern, so a directory named
    ``run[1]`` would otherwise read as "no checkpoint".
    """
    if not _GLOB_CHARACTERS.search(prefix):
        yield prefix
        return
    directory, base = os.path.split(os.path.abspath(prefix))
    with tempfile.TemporaryDirectory(prefix="resumeloader-inspect-") as links:
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if name.startswith(base + "."):
                    target = os.path.join(links, "ckpt" + name[len(base) :])
                    os.symlink(os.path.join(directory, name), target)
        yield os.path.join(links, "ckpt")


def find_states(path: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The checkpoint prefix of `path` (a directory or prefix) and its loader states by key.

    Raises:
        ValueError: no readable checkpoint at `path`.
        StateError: a loader state in it is malformed or corrupted.
    """
    import tensorflow as tf

    prefix = _resolve(path)
    states: dict[str, dict[str, Any]] = {}
    with _plain_prefix(prefix) as readable:
        try:
            reader = tf.train.load_checkpoint(readable)
        except (tf.errors.OpError, ValueError) as err:
            msg = f"Cannot read a TF checkpoint at {path!r}: {err}"
            raise ValueError(msg) from err
        for key in sorted(reader.get_variable_to_shape_map()):
            if not key.endswith(_SUFFIX):
                continue
            value = reader.get_tensor(key)
            text = value.decode() if isinstance(value, bytes) else str(value)
            try:
                candidate = json.loads(text)
            except ValueError:
                continue
            except RecursionError as err:
                msg = (
                    f"The value under {key[: -len(_SUFFIX)]!r} is JSON nested too deeply to "
                    f"be a loader state (a state is a flat dict). Received: {text[:40]!r}..."
                )
                raise errors.StateError(msg) from err
            if isinstance(candidate, dict) and {"version", "fingerprint"} <= set(candidate):
                states[key[: -len(_SUFFIX)]] = state_lib.parse(candidate)
    return prefix, states


def describe(state: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, value) lines: the position, then every stage's order fields."""
    shards = state["shard_count"]
    records_per_batch = state["batch_size"] * shards
    step = -(-state["offset"] // records_per_batch)
    offset = f"{state['offset']} records (all shards)"
    position = "-"
    # An epoch is the source unless the index stage fixes its length (a mixture).
    lengths = [v for k, v in state.items() if k.endswith(".records_per_epoch")]
    if lengths or "source.num_records" in state:
        num_records = lengths[0] if lengths else state["source.num_records"]
        kept = num_records - num_records % shards
        offset = f"{state['offset']} of {kept} records (all shards)"
        position = f"{state['epoch'] * kept + state['offset']} records (all shards)"
    lines = [
        ("epoch", str(state["epoch"])),
        ("offset in epoch", offset),
        ("position", position),
        ("step in epoch", f"{step} (batch_size {state['batch_size']} x {shards} shards)"),
        ("row in window", str(state["row"])),
    ]
    lines += [(key, str(value)) for key, value in sorted(state_lib.order_of(state).items())]
    lines += [("fingerprint", state["fingerprint"]), ("version", str(state["version"]))]
    return lines


def printable(text: str) -> str:
    """`text` with every character a terminal would act on escaped (``\\x1b`` for ESC).

    A checkpoint is data from elsewhere: a forged state's strings printed raw could
    retitle the terminal, clear it or hide lines.
    """
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def main(path: str, out: Console) -> int:
    """Prints every loader state in the checkpoint at `path`; returns the exit status."""
    try:
        prefix, states = find_states(path)
    except errors.StateError as err:
        text = "\n".join(map(printable, str(err).split("\n")))
        out.print(f"checkpoint holds a corrupted loader state: {text}")
        return 1
    number = re.search(r"-(\d+)$", prefix)
    out.print(f"checkpoint: {printable(prefix)}")
    out.print(f"checkpoint number: {number.group(1) if number else '-'}")
    if not states:
        out.print("no resumeloader state found in this checkpoint")
        return 1
    for key, state in states.items():
        out.print(f"loader: {printable(key)}")
        for field, value in describe(state):
            out.print(f"  {printable(field):<20} {printable(value)}")
    return 0
