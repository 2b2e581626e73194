"""How a producer's batches are timed: stage names, record loops split by sampling, storage.

`BatchProducer` closes a lap (`resumeloader.core.meters.Lap`) at each stage boundary
of a batch: after the read, the batch stage, each batch map stage. A record-by-record
loop (read, the record stages, the spec check, per record) is timed whole on every
timed batch and divided among its parts in proportion to what they took on sampled
batches (one in `meters.SPLIT_EVERY` timed batches per place): there, a *twin* of
the producer runs the loop with its source and record stages behind `Timed` proxies
that time each call. Per-record clocks on every record would cost more than the stages they time.

A worker in another process sends its counts with each batch (`Report`), the storage
layer's counters among them. No TensorFlow here.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from resumeloader.core import board as board_lib
from resumeloader.core import meters
from resumeloader.sources.storage import fetch, handles
from resumeloader.stages import pipeline as pipeline_lib

__all__ = [
    "CHECK", "HAND_OFF", "PRODUCE", "READ", "SAMPLER", "TRANSFER", "Names", "Report", "Timed",
    "nbytes", "split", "storage_counts", "storage_stats",
]

#: The laps of the producer (a task through read, record stages, batch stages).
PRODUCE = "produce"
#: The read of a task's records (one call, or one per record).
READ = "read"
#: The check of each record a record stage made against the record spec.
CHECK = "check"
#: The index stage: each task's record indices computed.
SAMPLER = "sampler"
#: Batches copied out of workers in other processes (shared memory).
TRANSFER = "transfer"
#: Batches made ready for TensorFlow in Python (tensors, decoded leaves).
HAND_OFF = "hand-off"

_now = time.perf_counter_ns


def _unique(names: list[str]) -> tuple[str, ...]:
    seen: collections.Counter[str] = collections.Counter()
    out = []
    for name in names:
        seen[name] += 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Names:
    """The meter names of a pipeline's Python stages, unique (``map_fn``, ``map_fn#2``).

    Attributes:
        records: the record stages' (``map_fn`` for `Pipeline.map`).
        batch: the batch stage's.
        maps: the batch map stages'.
        tensors: the tensor stages' (timed by the TensorFlow layer).
    """

    records: tuple[str, ...]
    batch: str
    maps: tuple[str, ...]
    tensors: tuple[str, ...]

    @classmethod
    def of(cls, pipeline: pipeline_lib.Pipeline) -> Names:
        """The names of `pipeline`'s stages."""
        records = ["map_fn" if s.name == "map" else s.name for s in pipeline.record_stages]
        assert pipeline.batch_stage is not None
        names = _unique([READ, *records, CHECK, pipeline.batch_stage.name,
                         *(s.name for s in pipeline.batch_map_stages),
                         *(s.name for s in pipeline.tensor_stages)])
        count, maps = len(records), len(pipeline.batch_map_stages)
        return cls(names[1 : 1 + count], names[2 + count],
                   names[3 + count : 3 + count + maps], names[3 + count + maps :])

    @property
    def loop(self) -> tuple[str, ...]:
        """The stages of a record-by-record loop, in order: the read, the record
        stages, the check (`split`)."""
        return (READ, *self.records, CHECK)

    @property
    def produced(self) -> tuple[str, ...]:
        """The stages a producer times, in order."""
        loop = (*self.records, CHECK) if self.records else ()
        return (READ, *loop, self.batch, *self.maps)


class Timed:
    """`target` (a source or a record stage) whose `read`, `read_many`, `read_batch` and
    `apply` add their time to ``spent[name]``; everything else passes through."""

    def __init__(self, target: Any, name: str, spent: collections.Counter[str]) -> None:
        self._target = target
        for attribute in ("read", "read_many", "read_batch", "apply"):
            method = getattr(target, attribute, None)
            if method is not None:
                setattr(self, attribute, _timed(method, name, spent))

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._target, attribute)


def _timed(method: Any, name: str, spent: collections.Counter[str]) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = _now()
        try:
            return method(*args, **kwargs)
        finally:
            spent[name] += _now() - start

    return timed


def split(lap: meters.Lap, names: Names, records: int, run: Any, twin: Any) -> Any:
    """Runs a record-by-record loop (``run()``, or ``twin(spent)()`` on a sampled batch,
    which fills ``spent`` by stage) and divides its time among `names`' loop stages."""
    place = lap.place
    if lap.splits:
        spent: collections.Counter[str] = collections.Counter()
        start = _now()
        out = twin(spent)()
        spent[CHECK] += max(0, _now() - start - sum(spent.values()))
        place.add_shares(spent)
    else:
        out = run()
    lap.split(place.loop_shares(names.loop), records)
    return out


def nbytes(arrays: Any) -> int:
    """The bytes of a list of arrays (what is not an array counts 0)."""
    return sum([getattr(a, "nbytes", 0) for a in arrays])


def storage_stats() -> dict[str, int]:
    """What the storage layer counted in this process so far: its GETs of objects
    (`fetch.stats`: ``gets``, ``retries``, ``bytes``, ``get_ns``, ``ranges``,
    ``cached``) and its reads of local files (``file_reads``, ``file_bytes``)."""
    files = handles.stats()
    return {**fetch.stats(), "file_reads": files["reads"], "file_bytes": files["bytes"]}


def storage_counts(last: dict[str, int]) -> dict[str, int]:
    """What the storage layer counted in this process since `last` (updated), as
    ``storage.<counter>``."""
    now = storage_stats()
    delta = {f"storage.{k}": v - last.get(k, 0) for k, v in now.items() if v != last.get(k, 0)}
    last.update(now)
    return delta


class Report:
    """What a worker elsewhere sends with each batch: its place's counts since the last
    report and the storage layer's."""

    def __init__(self, board: board_lib.Board | None) -> None:
        self._board = board
        self._storage: dict[str, int] = {}

    def take(self) -> tuple[Any, dict[str, int]] | None:
        """The counts to send now (None when counting is off)."""
        if self._board is None:
            return None
        return self._board.here().take(), storage_counts(self._storage)
