"""``resumeloader inspect``: the loader states stored in a checkpoint, without user code.

Two checkpoint formats hold a loader state, and both are read without importing
TensorFlow or Keras (a one-line answer, in milliseconds):

* a ``tf.train.Checkpoint`` (the TensorFlow backend, your own ``CheckpointManager``):
  a `ResumableLoader` is a ``PythonState``, stored as JSON under a key ending in
  ``/.ATTRIBUTES/py_state``; every such value whose JSON has resumeloader's
  ``version`` and ``fingerprint`` fields is a loader state. It is read by
  `resumeloader.tools.tf_bundle`, or by TensorFlow when that reader does not know
  the file's layout;
* a ``ckpt-N`` directory of a `ResumeCallback` on the JAX or PyTorch backends: its
  ``loader.json``.
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
from resumeloader.integrations import checkpoint_layout
from resumeloader.tools import quiet, tf_bundle

__all__ = ["find_states", "main", "printable"]

_SUFFIX = "/.ATTRIBUTES/py_state"
_GLOB_CHARACTERS = re.compile(r"[\[\]*?]")
#: The key a ResumeCallback's loader state has in a ``ckpt-N`` directory.
FILE_KEY = "loader"


def _resolve(path: str) -> str:
    """The checkpoint prefix of a directory (from its index file), or `path` itself."""
    if not os.path.isdir(path):
        if not os.path.exists(path + ".index"):
            msg = (
                f"No checkpoint at {path!r}: it is not a directory, nor a checkpoint prefix "
                f"({path + '.index'!r} does not exist)."
            )
            raise ValueError(msg)
        return path
    index = os.path.join(path, "checkpoint")
    if not os.path.isfile(index):
        msg = (
            f"No checkpoint found in directory {path!r} (no `checkpoint` index file, no "
            "ckpt-N directory of a ResumeCallback)."
        )
        raise ValueError(msg)
    cause: Exception | None = None
    try:
        # Reads the index file as it is: unlike tf.train.latest_checkpoint, no glob.
        prefix = tf_bundle.read_index_file(path)
    except (ValueError, UnicodeDecodeError, SyntaxError) as err:
        prefix, cause = None, err
    if prefix is None:
        why = f": {cause}" if cause is not None else ""
        msg = (
            f"The checkpoint index file {index!r} cannot be read as the one "
            f"tf.train.CheckpointManager writes{why}. Pass a checkpoint prefix instead "
            f"(e.g. {os.path.join(path, 'ckpt-1')!r})."
        )
        raise ValueError(msg) from cause
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


def _strings_with_tensorflow(path: str, prefix: str) -> dict[str, bytes]:
    """The loader-state candidates of `prefix`, read by TensorFlow's checkpoint reader."""
    with quiet.startup_filtered():
        import tensorflow as tf

    found: dict[str, bytes] = {}
    with _plain_prefix(prefix) as readable:
        try:
            reader = tf.train.load_checkpoint(readable)
        except (tf.errors.OpError, ValueError) as err:
            msg = f"Cannot read a TF checkpoint at {path!r}: {err}"
            raise ValueError(msg) from err
        for key in sorted(reader.get_variable_to_shape_map()):
            if key.endswith(_SUFFIX):
                value = reader.get_tensor(key)
                found[key] = value if isinstance(value, bytes) else str(value).encode()
    return found


def _loader_state(key: str, text: str) -> dict[str, Any] | None:
    """The parsed loader state in `text`, None if it is another object's JSON."""
    try:
        candidate = json.loads(text)
    except ValueError:
        return None
    except RecursionError as err:
        msg = (
            f"The value under {key!r} is JSON nested too deeply to be a loader state (a "
            f"state is a flat dict). Received: {text[:40]!r}..."
        )
        raise errors.StateError(msg) from err
    if isinstance(candidate, dict) and {"version", "fingerprint"} <= set(candidate):
        return state_lib.parse(candidate)
    return None


def find_states(path: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The checkpoint at `path` (a directory, a ``ckpt-N`` directory or a prefix) and
    its loader states by key. No TensorFlow import unless its reader is needed.

    Raises:
        ValueError: no readable checkpoint at `path`.
        StateError: a loader state in it is malformed or corrupted.
    """
    state_file = checkpoint_layout.loader_file(path) if os.path.isdir(path) else None
    if state_file is not None:
        with open(state_file, encoding="utf-8") as f:
            text = f.read()
        state = _loader_state(FILE_KEY, text)
        return os.path.dirname(state_file), {} if state is None else {FILE_KEY: state}
    prefix = _resolve(path)
    try:
        strings = tf_bundle.read_strings(prefix, lambda key: key.endswith(_SUFFIX))
    except tf_bundle.UnsupportedCheckpoint:
        strings = _strings_with_tensorflow(path, prefix)
    except OSError as err:
        msg = f"Cannot read a TF checkpoint at {path!r}: {err}"
        raise ValueError(msg) from err
    states: dict[str, dict[str, Any]] = {}
    for key in sorted(strings):
        state = _loader_state(key[: -len(_SUFFIX)], strings[key].decode("utf-8", "replace"))
        if state is not None:
            states[key[: -len(_SUFFIX)]] = state
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
