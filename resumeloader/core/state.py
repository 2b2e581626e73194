"""Loader state <-> a flat JSON-serialisable dict: version, fingerprint, validation.

A state is what a checkpoint holds for a loader:

* the *order fields*: every stage of the pipeline contributes the fields that define
  which record comes at which position, as ``"<stage>.<field>"`` keys (e.g.
  ``"sampler.seed"``), and a ``fingerprint`` hashing them;
* the *position*: ``epoch``, ``offset`` (records of the epoch's global order consumed
  by all shards together) and ``row``, always 0: a windowed batch stage (bucketing,
  packing, token budgets) needs no field of its own, because its batches tile each
  window and the position after any batch is still a number of records consumed
  (the window start plus the records of its batches before); a restore recomputes
  the window it lies in (`resumeloader.stages.plan`);
* the layout it was saved with (``shard_count``, ``batch_size``), informational:
  the global position does not depend on them, so another shard count or batch size
  can continue it (elastic resume).

What the fingerprint covers: the order fields only. It catches a corrupted or
hand-edited order field; the position fields are deliberately free, so that a
state can be moved to another position by hand (``dict(state, epoch=3, offset=0)``).

Version 1 states (resumeloader 0.1) are read and upgraded to version 2. Everything
here is pure Python.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from typing import Any

from resumeloader import errors
from resumeloader.core import history

__all__ = [
    "VERSION",
    "check_order",
    "fingerprint",
    "local_offset",
    "make",
    "parse",
    "to_json",
]

VERSION = 2
POSITION_FIELDS = ("epoch", "offset", "row")
LAYOUT_FIELDS = ("shard_count", "batch_size")
_TOP_FIELDS = ("version", "fingerprint", *POSITION_FIELDS, *LAYOUT_FIELDS)
_MAX_INT = 2**63 - 1
_MAX_ORDER_INT = 2**64 - 1
_MAX_TEXT = 1 << 16  # a state is < 1 KB; refuse anything absurdly larger before parsing

# Version 1 (0.1) field -> version 2 order field.
_V1_ORDER = {
    "num_records": "source.num_records",
    "algorithm": "sampler.algorithm",
    "shuffle": "sampler.shuffle",
    "seed": "pipeline.seed",
    "layout": "shards.layout",
}
_V1_FIELDS = frozenset(
    {"version", "fingerprint", "epoch", "offset", "shard_count", "batch_size", *_V1_ORDER}
)

Fields = dict[str, Any]

# Stages whose fields one side may lack: the bad-record policy. A pipeline without it
# raises at the first failing record, and one with it differs from it only there, so
# a checkpoint of either continues exactly in the other (differing values are refused).
OPTIONAL_STAGES = frozenset({"on_error"})

# The field in which a source names its content (``source.identity``,
# ``source.<name>.identity`` in a mixture), new in 0.3: a checkpoint without it (0.1,
# 0.2, or a source without an identity) is checked on every other field and restored.
IDENTITY_FIELD = "identity"


def _is_identity(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == IDENTITY_FIELD


# Two ways a file source names its objects beyond their names, sizes and layouts: their
# versions where they are stored, or digests of their bytes anywhere (`Storage.identity`).
# A checkpoint with one restores into a loader with the other after the other fields match.
_LOCATED, _CONTENT = "versions", "digests"


def _alternative(key: str, other: Fields) -> str | None:
    """The field of `other` that stands for `key` (a source's versions for its digests,
    or the reverse) when `other` lacks `key`; else None."""
    stage, _, field = key.rpartition(".")
    swap = {_LOCATED: _CONTENT, _CONTENT: _LOCATED}.get(field)
    if swap is None or key in other or f"{stage}.{swap}" not in other:
        return None
    return f"{stage}.{swap}"


def fingerprint(order: Fields) -> str:
    """A short stable hash of the order fields (keys containing a dot)."""
    fields = {k: v for k, v in order.items() if "." in k}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def make(
    order: Fields, *, epoch: int, offset: int, row: int = 0, shard_count: int, batch_size: int
) -> dict[str, Any]:
    """Builds a state dict; `offset` is the global offset within `epoch`."""
    return {
        "version": VERSION,
        **order,
        "fingerprint": fingerprint(order),
        "epoch": epoch,
        "offset": offset,
        "row": row,
        "shard_count": shard_count,
        "batch_size": batch_size,
    }


def _load(state: Any) -> Any:
    """A state given as JSON text (str or UTF-8 bytes) parsed; anything else as it is."""
    if isinstance(state, (bytes, bytearray, memoryview)):
        data = bytes(state)
        try:
            state = data.decode()
        except UnicodeDecodeError as err:
            msg = (
                "A loader state is JSON text, but this value is not text: it holds "
                f"{_describe_bytes(data)}. Received: {data!r:.80}. It was not saved by a "
                "ResumableLoader (e.g. another object saved under the loader's checkpoint key)."
            )
            raise errors.StateError(msg) from err
    if isinstance(state, str):
        if len(state) > _MAX_TEXT:
            msg = (
                f"A loader state is under 1 KB of JSON. Received {len(state)} characters: "
                f"{state!r:.80}."
            )
            raise errors.StateError(msg)
        try:
            return json.loads(state)
        except (ValueError, RecursionError) as err:
            found = "truncated JSON" if _truncated(state) else "text that is not JSON"
            msg = (
                f"A loader state must be a dict or its JSON text. Received {found} "
                f"({err}): {state!r:.80}."
            )
            raise errors.StateError(msg) from err
    return state


def _describe_bytes(data: bytes) -> str:
    """What binary data looks like, for an error message."""
    if len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5:  # PROTO opcode, protocol
        return f"a Python pickle (protocol {data[1]}, {len(data)} bytes; nothing was unpickled)"
    return f"{len(data)} bytes of binary data"


def _truncated(text: str) -> bool:
    """Whether `text` is the start of a JSON object whose end is missing."""
    stripped = text.strip()
    return stripped.startswith("{") and not stripped.endswith("}")


def _upgrade_v1(state: dict[str, Any]) -> dict[str, Any]:
    missing = sorted(_V1_FIELDS - set(state))
    unknown = sorted(set(state) - _V1_FIELDS)
    if missing or unknown:
        msg = f"Malformed loader state. Missing fields: {missing}; unknown fields: {unknown}."
        raise errors.StateError(msg)
    old = {k: state[k] for k in ("algorithm", "layout", "num_records", "seed", "shuffle")}
    canonical = json.dumps(old, sort_keys=True)
    if hashlib.sha256(canonical.encode()).hexdigest()[:16] != state["fingerprint"]:
        msg = (
            "Loader state fingerprint does not match its fields: the state is corrupted or "
            f"was edited. Received: fingerprint={state['fingerprint']!r} (a version 1 state)."
        )
        raise errors.StateError(msg)
    order = {new: state[old_key] for old_key, new in _V1_ORDER.items()}
    upgraded = make(
        order,
        epoch=state["epoch"],
        offset=state["offset"],
        shard_count=state["shard_count"],
        batch_size=state["batch_size"],
    )
    return upgraded


def _check_value(key: str, value: Any, *, kinds: tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = "an int >= 0" if kinds == (int,) else "an int or a str"
        msg = (
            f"Loader state field `{key}` must be {wanted}. Received: {key}={value!r:.80} "
            f"of type {type(value).__name__}."
        )
        raise errors.StateError(msg)
    # Position fields count records (int64 in the graph); order fields hold seeds (uint64).
    low, high, bounds = (0, _MAX_INT, "[0, 2**63)") if kinds == (int,) else (
        -_MAX_ORDER_INT, _MAX_ORDER_INT, "(-2**64, 2**64)")
    if isinstance(value, int) and not low <= value <= high:
        msg = f"Loader state field `{key}` must be in {bounds}. Received: {key}={value!r:.80}."
        raise errors.StateError(msg)


def parse(state: Any) -> dict[str, Any]:
    """Validates a state (a dict or its JSON text) and returns it as a version 2 dict.

    Raises:
        StateError: not a dict, a missing or unknown field, a field of the wrong
            type, a value out of range, an unknown version or a fingerprint that
            does not match the order fields (a corrupted or hand-edited state).
    """
    state = _load(state)
    if not isinstance(state, dict):
        msg = f"A loader state must be a dict. Received: {type(state).__name__}: {state!r:.80}."
        raise errors.StateError(msg)
    version = state.get("version")
    if version == 1 and not isinstance(version, bool):
        state = _upgrade_v1(state)
    elif version != VERSION or isinstance(version, bool):
        msg = (
            f"Unsupported loader state version. Received: version={version!r:.40}; "
            f"this resumeloader reads versions 1 and {VERSION}."
        )
        raise errors.StateError(msg)
    missing = sorted(set(_TOP_FIELDS) - set(state))
    unknown = sorted(k for k in state if k not in _TOP_FIELDS and "." not in str(k))
    if missing or unknown:
        msg = f"Malformed loader state. Missing fields: {missing}; unknown fields: {unknown}."
        raise errors.StateError(msg)
    for key, value in state.items():
        if key == "fingerprint":
            _check_value(key, value, kinds=(str,))
        elif key in _TOP_FIELDS:
            _check_value(key, value, kinds=(int,))
        else:
            _check_value(key, value, kinds=(int, str))
    if state["shard_count"] < 1 or state["batch_size"] < 1:
        msg = (
            "Loader state fields `shard_count` and `batch_size` must be >= 1. Received: "
            f"shard_count={state['shard_count']}, batch_size={state['batch_size']}."
        )
        raise errors.StateError(msg)
    if fingerprint(state) != state["fingerprint"]:
        msg = (
            "Loader state fingerprint does not match its order fields: the state is corrupted "
            f"or was edited. Received: fingerprint={state['fingerprint']!r}, fields hash to "
            f"{fingerprint(state)!r}."
        )
        raise errors.StateError(msg)
    return dict(state)


def order_of(state: dict[str, Any]) -> Fields:
    """The order fields of a parsed state."""
    return {k: v for k, v in state.items() if "." in k}


def check_order(
    saved: dict[str, Any],
    expected: Fields,
    explain: Callable[[str, int | str], str | None] | None = None,
) -> None:
    """Raises `StateMismatchError` naming every order field (``stage.field``) that differs.

    A stage that only one of the two pipelines has is named once, with its fields
    (except one of `OPTIONAL_STAGES`, which may be missing on either side). A
    source's `IDENTITY_FIELD` that one side lacks is not compared (a warning says
    that only the other fields were checked); neither are a source's object versions
    on one side and its content digests on the other (data moved to other storage,
    `Storage.identity`; a warning too). A field only the checkpoint has is explained
    by `explain` as well. The data history (`history.FIELD`) is
    not compared here: `history.check_past` compares it up to the state's position.
    `explain(key, saved value)`, when given, may say in words why a field differs (e.g.
    which objects changed): its line follows the field's.
    """
    # The data history is checked by position, not as a value (`history.check_past`).
    saved_order = {k: v for k, v in order_of(saved).items() if k != history.FIELD}
    expected = {k: v for k, v in expected.items() if k != history.FIELD}
    lines = []
    unchecked = []
    moved = []
    for key in sorted(set(saved_order) | set(expected)):
        other = expected if key in saved_order else saved_order
        stage = key.split(".", 1)[0]
        if stage in OPTIONAL_STAGES and not any(k.split(".", 1)[0] == stage for k in other):
            continue  # the optional stage is absent on the other side
        if _is_identity(key) and key not in other:
            unchecked.append(key)
            continue
        if _alternative(key, other) is not None:
            moved += [key] if key in saved_order else []
            continue
        if key in saved_order and key in expected:
            if saved_order[key] != expected[key]:
                lines.append(
                    f"  {key}: checkpoint has {saved_order[key]!r}, "
                    f"this loader has {expected[key]!r}"
                )
                why = explain(key, saved_order[key]) if explain is not None else None
                if why:
                    lines.append(f"    ({why})")
        elif key in saved_order:
            lines.append(f"  {key}: checkpoint has {saved_order[key]!r}, this loader has none")
            why = explain(key, saved_order[key]) if explain is not None else None
            if why:
                lines.append(f"    ({why})")
        else:
            lines.append(f"  {key}: checkpoint has none, this loader has {expected[key]!r}")
    if lines:
        keys = [line for line in lines if not line.startswith("    (")]  # not explanations
        stages = sorted({line.strip().split(".", 1)[0] for line in keys})
        msg = (
            "The loader state was saved by a pipeline with a different record order "
            f"(stages {', '.join(stages)} differ); restoring it would silently change which "
            "records come next.\n" + "\n".join(lines)
        )
        raise errors.StateMismatchError(msg)
    for key in moved:
        how = "versions" if key.endswith(_LOCATED) else "content"
        warnings.warn(
            f"The checkpoint identifies the data by {how} ({key}), this loader by "
            f"{'content' if how == 'versions' else 'versions'}: only the files' names, sizes "
            "and record layouts were compared, not every byte. A checkpoint saved by this "
            "loader carries its own identity.",
            UserWarning,
            stacklevel=3,
        )
    if unchecked:
        if unchecked[0] not in saved_order:
            why = "the checkpoint has none (it was written before resumeloader 0.3)"
            after = "The next checkpoint saved carries it."
        else:
            why = "this loader's source has none"
            after = "Give the source an identity (see `RandomAccessSource`) to check it."
        warnings.warn(
            f"The data's content identity ({', '.join(unchecked)}) was not checked: {why}. "
            f"Only its length and the other order fields were compared. {after}",
            UserWarning,
            stacklevel=3,
        )


def local_offset(saved: dict[str, Any], *, shard_count: int, num_records: int) -> tuple[int, int]:
    """Converts a saved (epoch, global offset) to (epoch, offset) of one of `shard_count` shards.

    Args:
        saved: a parsed state.
        shard_count: the shard count of the loader restoring it.
        num_records: records of an epoch's global order.

    Raises:
        ElasticResumeError: the global offset is not a multiple of `shard_count`, so
            the shards cannot continue the global stream exactly.
        StateError: the offset lies past the end of the epoch.
    """
    epoch, offset = saved["epoch"], saved["offset"]
    if offset > num_records:
        msg = (
            f"Loader state offset {offset} lies past the end of an epoch of "
            f"{num_records} records."
        )
        raise errors.StateError(msg)
    if offset % shard_count:
        msg = (
            "Cannot resume exactly with this shard count: the checkpoint's global offset "
            f"is not divisible by it. Received: offset={offset} (epoch {epoch}, saved with "
            f"shard_count={saved['shard_count']}), shard_count={shard_count}. Resume with a "
            f"shard count that divides {offset}, or from another checkpoint."
        )
        raise errors.ElasticResumeError(msg)
    kept = num_records - num_records % shard_count
    if offset >= kept:
        # Every record this layout keeps in the epoch was consumed.
        return epoch + 1, 0
    return epoch, offset // shard_count


def to_json(state: dict[str, Any]) -> str:
    """Canonical JSON text of a state (sorted keys, no spaces)."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"))
