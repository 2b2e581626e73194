"""``resumeloader inspect``: the loader states stored in a TF checkpoint, without user code.

A `ResumableLoader` is a ``PythonState``; ``tf.train.Checkpoint`` stores its JSON
under a key ending in ``/.ATTRIBUTES/py_state``. Every such value whose JSON has
resumeloader's ``version`` and ``fingerprint`` fields is a loader state.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from rich.console import Console

from resumeloader import errors
from resumeloader.core import state as state_lib

__all__ = ["find_states", "main"]

_SUFFIX = "/.ATTRIBUTES/py_state"


def _resolve(path: str) -> str:
    import tensorflow as tf

    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            msg = f"No checkpoint found in directory {path!r} (no `checkpoint` index file)."
            raise ValueError(msg)
        return str(latest)
    return path


def find_states(path: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The checkpoint prefix of `path` (a directory or prefix) and its loader states by key.

    Raises:
        ValueError: no checkpoint at `path`.
        StateError: a loader state in it is malformed or corrupted.
    """
    import tensorflow as tf

    prefix = _resolve(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as err:
        msg = f"Cannot read a TF checkpoint at {path!r}: {err}"
        raise ValueError(msg) from err
    states: dict[str, dict[str, Any]] = {}
    for key in sorted(reader.get_variable_to_shape_map()):
        if not key.endswith(_SUFFIX):
            continue
        value = reader.get_tensor(key)
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            candidate = json.loads(text)
        except ValueError:
            continue
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


def main(path: str, out: Console) -> int:
    """Prints every loader state in the checkpoint at `path`; returns the exit status."""
    try:
        prefix, states = find_states(path)
    except errors.StateError as err:
        out.print(f"checkpoint holds a corrupted loader state: {err}")
        return 1
    number = re.search(r"-(\d+)$", prefix)
    out.print(f"checkpoint: {prefix}")
    out.print(f"checkpoint number: {number.group(1) if number else '-'}")
    if not states:
        out.print("no resumeloader state found in this checkpoint")
        return 1
    for key, state in states.items():
        out.print(f"loader: {key}")
        for field, value in describe(state):
            out.print(f"  {field:<20} {value}")
    return 0
