"""`History` of a run's data: amendments (`MixChange`, `Skip`) at positions; its state entry.

An *amendment* changes the stream from a position of the global order on (``at``:
``epoch * records_per_epoch + offset``, the records of the global order consumed by
all shards; with one shard, the loader's position). Before it the stream is the one
without it, so every past batch stays recomputable; after it, it is the amended
stream. Two kinds:

* `MixChange`: a mixture's weights from ``at`` on (a source added with a weight, a
  source removed with weight 0). Each source continues its own walk where it stood.
* `Skip`: the positions ``[start, stop)`` are never handed out: the loader jumps from
  ``start`` to ``stop`` (skipped positions are counted by the position, not by steps).

A `History` is the sorted amendments of a pipeline. The state carries it compactly
as one order field, `FIELD`: one entry per amendment, ``<at>m<digest>`` for a mixture
change (a digest of the weights and the added sources' identity) and
``<start>s<length>`` for a skip, comma-separated (16 amendments take ~320 bytes). A
checkpoint restores into a pipeline whose amendments *before the checkpoint's
position* are exactly its own; amendments at or after it are the restoring
pipeline's to choose (`check_past`). Pure Python.
"""

from __future__ import annotations

import dataclasses
import fractions
import hashlib
import itertools
import re
from collections.abc import Iterable
from typing import ClassVar

from resumeloader import errors
from resumeloader.core import validate

__all__ = ["FIELD", "MAX_AMENDMENTS", "History", "MixChange", "Skip", "check_past"]

#: The state's order field holding the history (absent when there is none).
FIELD = "history.amendments"
#: Amendments a pipeline may carry (the state stays small).
MAX_AMENDMENTS = 64
_MAX_POSITION = 2**63 - 1
_ENTRY = re.compile(r"(\d{1,19})([ms])([0-9a-f]{10}|\d{1,19})")


def _position(name: str, value: object) -> int:
    return validate.integer(name, value, low=0, high=_MAX_POSITION)


@dataclasses.dataclass(frozen=True)
class MixChange:
    """A mixture's weights from position `at` on.

    Attributes:
        at: the position of the global order where the new weights take effect.
        weights: ``(name, weight)`` of every source of the mixture, sorted by name;
            weight 0 means the source supplies nothing from `at` on (removed).
        added: ``(name, identity)`` of the sources this change adds to the mixture,
            `identity` a digest of their order fields (length, content identity).
    """

    kind: ClassVar[str] = "m"
    at: int
    weights: tuple[tuple[str, fractions.Fraction], ...]
    added: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _position("at", self.at))
        if not any(w > 0 for _, w in self.weights):
            shown = {n: str(w) for n, w in self.weights}
            msg = (
                "A mixture change needs at least one source with a positive weight. "
                f"Received: weights={shown} at position {self.at}."
            )
            raise ValueError(msg)

    @property
    def position(self) -> int:
        """Where it takes effect."""
        return self.at

    @property
    def active(self) -> tuple[tuple[str, fractions.Fraction], ...]:
        """The sources that supply records from `at` on, with their weights."""
        return tuple((n, w) for n, w in self.weights if w > 0)

    def digest(self) -> str:
        """10 hex digits naming the weights and the added sources."""
        weights = ",".join(f"{n}:{w}" for n, w in self.weights)
        text = weights + ";" + ",".join(f"{n}:{i}" for n, i in self.added)
        return hashlib.blake2b(text.encode(), digest_size=5, person=b"rl-mixchange").hexdigest()

    def entry(self) -> str:
        """The state entry: ``<at>m<digest>``."""
        return f"{self.at}m{self.digest()}"

    def describe(self) -> str:
        """E.g. ``at 1,000: weights code 1/2, web 1/2 (adds code)``."""
        total = sum((w for _, w in self.weights), fractions.Fraction(0))
        shown = ", ".join(f"{n} {w / total}" for n, w in self.weights)
        added = f" (adds {', '.join(n for n, _ in self.added)})" if self.added else ""
        return f"at {self.at:,}: weights {shown}{added}"


@dataclasses.dataclass(frozen=True)
class Skip:
    """The positions ``[start, stop)`` of the global order, never handed out."""

    kind: ClassVar[str] = "s"
    start: int
    stop: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", _position("start", self.start))
        object.__setattr__(self, "stop", _position("stop", self.stop))
        if self.stop <= self.start:
            msg = (
                "A skip must name at least one position: `stop` must be greater than "
                f"`start`. Received: start={self.start}, stop={self.stop}."
            )
            raise ValueError(msg)

    @property
    def position(self) -> int:
        """Where it takes effect."""
        return self.start

    def entry(self) -> str:
        """The state entry: ``<start>s<number of positions>``."""
        return f"{self.start}s{self.stop - self.start}"

    def describe(self) -> str:
        """E.g. ``at 1,000: skip of positions [1,000, 1,500)``."""
        return f"at {self.start:,}: skip of positions [{self.start:,}, {self.stop:,})"


Amendment = MixChange | Skip


@dataclasses.dataclass(frozen=True)
class History:
    """A pipeline's amendments, sorted by position (mixture changes before skips)."""

    amendments: tuple[Amendment, ...] = ()

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.amendments, key=lambda a: (a.position, a.kind)))
        object.__setattr__(self, "amendments", ordered)
        if len(ordered) > MAX_AMENDMENTS:
            msg = (
                f"A pipeline carries at most {MAX_AMENDMENTS} amendments (they travel in "
                f"every checkpoint). Received: {len(ordered)}."
            )
            raise ValueError(msg)
        changes = [a.at for a in self.changes]
        for before, after in itertools.pairwise(changes):
            if before == after:
                msg = (
                    "Two mixture changes take effect at the same position, so which weights "
                    f"hold there is ambiguous. Received: two at position {before}; give one "
                    "change with the final weights."
                )
                raise ValueError(msg)
        skips = self.skips
        for first, second in itertools.pairwise(skips):
            if second.start < first.stop:
                msg = (
                    "Skips must not overlap (each names its own positions). Received: "
                    f"[{first.start}, {first.stop}) and [{second.start}, {second.stop}); "
                    "give one skip covering both."
                )
                raise ValueError(msg)

    def __bool__(self) -> bool:
        return bool(self.amendments)

    def __len__(self) -> int:
        return len(self.amendments)

    def plus(self, amendment: Amendment) -> History:
        """This history with `amendment` added."""
        return History((*self.amendments, amendment))

    @property
    def changes(self) -> tuple[MixChange, ...]:
        """The mixture changes, by position."""
        return tuple(a for a in self.amendments if isinstance(a, MixChange))

    @property
    def skips(self) -> tuple[Skip, ...]:
        """The skips, by position."""
        return tuple(a for a in self.amendments if isinstance(a, Skip))

    def entries(self) -> str:
        """The state's `FIELD` value."""
        return ",".join(a.entry() for a in self.amendments)

    def order_fields(self) -> dict[str, int | str]:
        """``{FIELD: entries}``, or nothing without amendments (the state of 0.2)."""
        return {FIELD: self.entries()} if self.amendments else {}


def parse_entries(text: str) -> list[tuple[int, str, str]]:
    """The ``(position, kind, payload)`` of each entry of a state's `FIELD`.

    Raises:
        StateError: the text is not a list of entries.
    """
    if text == "":
        return []
    parsed = []
    for entry in text.split(","):
        match = _ENTRY.fullmatch(entry)
        if match is None:
            msg = (
                f"Loader state field `{FIELD}` is malformed: entry {entry!r:.60} is not "
                "`<position>m<digest>` or `<position>s<length>`."
            )
            raise errors.StateError(msg)
        parsed.append((int(match[1]), match[2], match[3]))
    return parsed


def _shown(position: int, kind: str, payload: str) -> str:
    if kind == "s":
        return f"skip of positions [{position:,}, {position + int(payload):,})"
    return f"mixture change at {position:,} (digest {payload})"


def check_past(saved: str | None, own: History, *, past_end: int) -> None:
    """Raises unless the amendments before `past_end` are the same in both histories.

    Args:
        saved: the checkpoint's `FIELD` (None when it has none).
        own: the restoring pipeline's history.
        past_end: the checkpoint's position in the global order (for a windowed batch
            stage restored inside a window, that window's end: its batches were
            grouped with the records after the position).

    Raises:
        StateError: `saved` is malformed.
        StateMismatchError: an amendment before `past_end` is missing from either
            side, moved or changed; the message names each.
    """
    theirs = [e for e in parse_entries(saved or "") if e[0] < past_end]
    ours = [
        (a.position, a.kind, a.entry()[len(str(a.position)) + 1 :])
        for a in own.amendments
        if a.position < past_end
    ]
    if theirs == ours:
        return
    described = {(a.position, a.kind): a.describe() for a in own.amendments}
    lines = []
    for entry in theirs:
        if entry not in ours:
            mine = described.get(entry[:2])
            if mine is not None:
                lines.append(
                    f"  changed: the checkpoint's {_shown(*entry)}; this pipeline has {mine}"
                )
            else:
                lines.append(f"  missing here: the checkpoint's {_shown(*entry)}")
    for entry in ours:
        if entry not in theirs and not any(t[:2] == entry[:2] for t in theirs):
            lines.append(
                f"  not in the checkpoint: {described[entry[:2]]} (added at a position "
                "already passed)"
            )
    msg = (
        "The loader state's data history differs from this pipeline's before the "
        f"checkpoint's position ({past_end:,} of the global order): restoring it would "
        "silently change which records were trained on. Amendments may only be added at "
        "or after a checkpoint's position.\n" + "\n".join(lines)
    )
    raise errors.StateMismatchError(msg)


def merged(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, non-empty ranges: overlapping or touching ones joined."""
    out: list[list[int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return tuple((a, b) for a, b in out)
