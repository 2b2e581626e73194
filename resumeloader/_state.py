"""Loader state <-> a flat JSON-serialisable dict; versioning, fingerprint, validation.

The state is what a checkpoint holds for a loader: a version, the fields that define
the record order (and a fingerprint of them), and the position as (epoch, global
offset). The global offset counts records of the epoch's global order consumed by
all shards together, so a state saved with one shard count or batch size can be
continued with another (elastic resume). Everything here is pure Python.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from resumeloader import _sampler, errors

__all__ = ["VERSION", "check_order", "fingerprint", "local_offset", "make", "parse"]

VERSION = 1
LAYOUT = "strided-v1"
# The fields that define which record comes at which global position.
ORDER_FIELDS = ("algorithm", "layout", "num_records", "seed", "shuffle")
_INT_FIELDS = ("version", "num_records", "seed", "shuffle", "epoch", "offset", "shard_count",
               "batch_size")
_STR_FIELDS = ("algorithm", "layout", "fingerprint")
FIELDS = tuple(sorted(_INT_FIELDS + _STR_FIELDS))


def order(*, num_records: int, seed: int, shuffle: bool) -> dict[str, Any]:
    """The order-defining fields of a loader, as stored in its state."""
    return {
        "algorithm": _sampler.ALGORITHM,
        "layout": LAYOUT,
        "num_records": num_records,
        "seed": seed,
        "shuffle": int(shuffle),
    }


def fingerprint(order_fields: dict[str, Any]) -> str:
    """A short stable hash of the order-defining fields."""
    canonical = json.dumps({k: order_fields[k] for k in ORDER_FIELDS}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def make(
    order_fields: dict[str, Any], *, epoch: int, offset: int, shard_count: int, batch_size: int
) -> dict[str, Any]:
    """Builds a state dict; `offset` is the global offset within `epoch`."""
    return {
        "version": VERSION,
        **order_fields,
        "fingerprint": fingerprint(order_fields),
        "epoch": epoch,
        "offset": offset,
        "shard_count": shard_count,
        "batch_size": batch_size,
    }


def parse(state: Any) -> dict[str, Any]:
    """Validates the shape of a state (a dict or its JSON text) and returns it as a dict.

    Raises:
        StateError: not a dict, a missing or unknown field, a field of the wrong
            type, a negative value, an unknown version or a fingerprint that does not
            match the fields (a corrupted or hand-edited state).
    """
    if isinstance(state, (str, bytes)):
        try:
            state = json.loads(state)
        except ValueError as err:
            msg = f"A loader state must be a dict or its JSON text. Received: {state!r:.80}."
            raise errors.StateError(msg) from err
    if not isinstance(state, dict):
        msg = f"A loader state must be a dict. Received: {type(state).__name__}."
        raise errors.StateError(msg)
    if state.get("version") != VERSION:
        msg = (
            f"Unsupported loader state version. Received: version={state.get('version')!r}; "
            f"this resumeloader reads version {VERSION}."
        )
        raise errors.StateError(msg)
    missing = sorted(set(FIELDS) - set(state))
    unknown = sorted(set(state) - set(FIELDS))
    if missing or unknown:
        msg = f"Malformed loader state. Missing fields: {missing}; unknown fields: {unknown}."
        raise errors.StateError(msg)
    for key in _INT_FIELDS:
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            msg = f"Loader state field `{key}` must be an int >= 0. Received: {key}={value!r}."
            raise errors.StateError(msg)
    for key in _STR_FIELDS:
        if not isinstance(state[key], str):
            msg = f"Loader state field `{key}` must be a str. Received: {key}={state[key]!r}."
            raise errors.StateError(msg)
    if state["shard_count"] < 1 or state["batch_size"] < 1:
        msg = (
            "Loader state fields `shard_count` and `batch_size` must be >= 1. Received: "
            f"shard_count={state['shard_count']}, batch_size={state['batch_size']}."
        )
        raise errors.StateError(msg)
    if fingerprint(state) != state["fingerprint"]:
        msg = (
            "Loader state fingerprint does not match its fields: the state is corrupted or "
            f"was edited. Received: fingerprint={state['fingerprint']!r}, fields hash to "
            f"{fingerprint(state)!r}."
        )
        raise errors.StateError(msg)
    return dict(state)


def check_order(saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raises `StateMismatchError` naming every order-defining field that differs."""
    differing = [k for k in ORDER_FIELDS if saved[k] != expected[k]]
    if differing:
        lines = "\n".join(
            f"  {k}: checkpoint has {saved[k]!r}, this loader has {expected[k]!r}"
            for k in differing
        )
        msg = (
            "The loader state was saved by a loader with a different record order; "
            f"restoring it would silently change which records come next.\n{lines}"
        )
        raise errors.StateMismatchError(msg)


def local_offset(saved: dict[str, Any], *, shard_count: int, num_records: int) -> tuple[int, int]:
    """Converts a saved (epoch, global offset) to (epoch, offset) of one of `shard_count` shards.

    Raises:
        ElasticResumeError: the global offset is not a multiple of `shard_count`, so
            the shards cannot continue the global stream exactly, or it lies past the
            end of the epoch.
    """
    epoch, offset = saved["epoch"], saved["offset"]
    if offset % shard_count:
        msg = (
            "Cannot resume exactly with this shard count: the checkpoint's global offset "
            f"is not divisible by it. Received: offset={offset} (epoch {epoch}, saved with "
            f"shard_count={saved['shard_count']}), shard_count={shard_count}. Resume with a "
            f"shard count that divides {offset}, or from another checkpoint."
        )
        raise errors.ElasticResumeError(msg)
    kept = num_records - num_records % shard_count
    if offset > num_records:
        msg = (
            f"Loader state offset {offset} lies past the end of an epoch of "
            f"{num_records} records."
        )
        raise errors.StateError(msg)
    if offset >= kept:
        # Every record this layout keeps in the epoch was consumed.
        return epoch + 1, 0
    return epoch, offset // shard_count


def to_json(state: dict[str, Any]) -> str:
    """Canonical JSON text of a state (sorted keys, no spaces)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"))
