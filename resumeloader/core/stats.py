"""`Stats`: what a loader's stages did — a table, a dict, and the bottleneck stage.

Made from a `resumeloader.core.board.Board` snapshot (``loader.stats()``). One row per
stage, in the order batches pass them, its counts summed over the places that ran it
(threads, worker processes, Dask workers), each place's timed laps scaled to all its
laps (batches and records exact, times estimated from the timed batches). A stage
*allows* ``records / (wall time / places)`` records per second: what it would deliver
if it alone ran, as often as it has places to run in (its measured wall time includes
waiting for the GIL, so threads that contend are not counted twice). The
**bottleneck** is the stage that allows the fewest. The consumer's figures say what
the training loop waited for data per step. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from resumeloader.core import board as board_lib
from resumeloader.core import meters

__all__ = ["Stage", "Stats", "Worker", "where"]

#: Who made a window decision that does not say (``by``): ``Workers(..., window="auto")``.
WINDOW_AUTO = "window='auto'"

_WORKER_THREAD = re.compile(r"resumeloader-worker-(\d+)")


def where(name: str) -> str:
    """How a table names the place `name` (`resumeloader.core.board.Board` names):
    ``"hand-out thread"``, ``"thread worker 0"``, ``"process worker 1"``, ..."""
    found = _WORKER_THREAD.fullmatch(name)
    if found:
        return f"thread worker {found.group(1)}"
    return "hand-out thread" if name == "hand-out" else name


def _kind(name: str) -> str:
    label = where(name)
    for kind in ("thread worker", "process worker", "Dask worker"):
        if label.startswith(kind):
            return kind
    return label


def _scaled(place: dict[str, Any], stage: str) -> dict[str, float]:
    """A place's figures of `stage`, from its timed laps to all its laps: times and bytes
    scaled by laps / timed laps of its kind, records by records / timed records, batches
    by batches / timed batches (a lap may make a chunk of batches)."""
    values = place["stages"][stage]
    kind = place.get("kinds", {}).get(values.get("kind", ""))
    laps = records = batches = 1.0
    if kind is not None and kind["timed"]:
        laps = kind["laps"] / kind["timed"]
        records = kind["records"] / kind["timed_records"] if kind["timed_records"] else laps
        batches = kind["batches"] / kind["timed_batches"] if kind["timed_batches"] else laps
    out = {key: values[key] * laps for key in ("bytes_out", "wall_ns")}
    out["batches"] = values["batches"] * batches
    out.update({key: values[key] * records for key in ("records_in", "records_out")})
    out.update({key: values[key] for key in ("cpu_ns", "cpu_wall_ns")})
    return out


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage's counts over every place that ran it.

    Attributes:
        name: the stage (``sampler``, ``read``, ``map_fn``, ``batch``, ...).
        where: where it ran (``"hand-out thread"``, ``"2 thread workers"``, ...).
        places: how many calls could run at once (places, tf.data's parallelism).
        batches, records_in, records_out, bytes_out: what passed through it.
        wall_s: its wall time summed over places.
        cpu_s: its CPU time (estimated from sampled batches), or None if not read.
    """

    name: str
    where: str
    places: int
    batches: int
    records_in: int
    records_out: int
    bytes_out: int
    wall_s: float
    cpu_s: float | None

    @property
    def us_per_record(self) -> float | None:
        """Wall microseconds per record (summed over places)."""
        return self.wall_s * 1e6 / self.records_in if self.records_in else None

    @property
    def allows(self) -> float | None:
        """Records per second this stage allows (records / (wall / places))."""
        if not self.records_in or self.wall_s <= 0:
            return None
        return self.records_in * self.places / self.wall_s


@dataclasses.dataclass(frozen=True)
class Worker:
    """One place that makes batches: how busy it was.

    Attributes:
        name: the place (``"thread worker 0"``, ``"process worker 1"``, ...).
        busy_s: wall seconds in stages.
        alive_s: seconds since it first made a batch.
        process_cpu_s: CPU seconds of its process (a worker process), or None.
    """

    name: str
    busy_s: float
    alive_s: float
    process_cpu_s: float | None

    @property
    def busy(self) -> float:
        """The busy fraction of its lifetime (0 to 1)."""
        return min(1.0, self.busy_s / self.alive_s) if self.alive_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Stats:
    """A loader's stage counters and timers, since it was made (``loader.stats()``).

    Batches and records are exact; wall and CPU times are estimated from the timed
    batches (one in 8 per place, or one chunk of batches in 8 where a chunk is made
    at once; all with ``RESUMELOADER_STATS=all``). ``str()`` is a
    table, `to_dict` plain JSON data, `bottleneck` the stage that allows the fewest
    records/s, `since` the interval between two values of one loader. Reading them
    never changes the stream.

    Attributes:
        elapsed_s: seconds since the loader was made.
        process_cpu_s: CPU seconds of this process since then (all threads,
            TensorFlow's included).
        stages: one `Stage` per stage that ran, in chain order.
        workers: the places that made batches, and how busy each was.
        steps: the consumer's steps: every batch of ``for batch in loader``
            (exact), every eager ``advance()`` after a batch made in Python;
            wait_s: the data wait they saw, in total (``for batch in loader`` times
            one step in 128, scaled to all); max_wait_s: the longest timed wait;
            compute_s: the consumer's time between batches (estimated likewise).
        queues: per queue, its mean and largest depth and its capacity.
        counts: plain counters (``storage.gets``, ``storage.bytes``, ...).
        counting: False when counting was off (``RESUMELOADER_STATS=0``): all empty.
        decisions: what ``Workers("auto")``, ``window="auto"`` and read-ahead decided, oldest
            first: per decision the batch it took effect after, ``kind``,
            ``num_workers`` and ``why`` (what was measured); a window's decision also
            has ``window`` (the most batch tasks in flight from then on), ``where``
            (the workers) and, under ``Workers("auto")``, ``by``. A read-ahead
            decision of ``ObjectReads(readahead_bytes="auto")`` has ``batch`` (the
            tasks handed on before it), ``readahead_bytes`` (the budget from then on)
            and ``why``.
    """

    elapsed_s: float
    process_cpu_s: float
    stages: tuple[Stage, ...]
    workers: tuple[Worker, ...]
    steps: int
    wait_s: float
    max_wait_s: float
    compute_s: float
    queues: dict[str, dict[str, float | int | None]]
    counts: dict[str, int]
    counting: bool = True
    decisions: tuple[dict[str, Any], ...] = ()
    snapshot: dict[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def off(cls) -> Stats:
        """The stats of a loader that counts nothing (``RESUMELOADER_STATS=0``)."""
        return cls(0.0, 0.0, (), (), 0, 0.0, 0.0, 0.0, {}, {}, counting=False)

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> Stats:
        """The stats of a `Board.snapshot`."""
        places = snapshot["places"]
        names = list(snapshot["chain"])
        for place in places:
            names += [s for s in place["stages"] if s not in names]
        stages = []
        for name in names:
            ran = [p for p in places if p["stages"].get(name, {}).get("batches")]
            if not ran:
                continue
            scaled = [_scaled(p, name) for p in ran]
            total = {k: sum(s[k] for s in scaled) for k in scaled[0]}
            cpu = None
            if total["cpu_wall_ns"]:
                cpu = total["wall_ns"] * total["cpu_ns"] / total["cpu_wall_ns"] / 1e9
            kinds = sorted({_kind(p["name"]) for p in ran})
            count = sum(p["parallel"] for p in ran)
            if len(ran) == 1:
                label = where(ran[0]["name"])
            elif len(kinds) == 1:
                label = f"{len(ran)} {kinds[0]}s"
            else:
                label = f"{len(ran)} places"
            stages.append(Stage(
                name, label, count, round(total["batches"]), round(total["records_in"]),
                round(total["records_out"]), round(total["bytes_out"]), total["wall_ns"] / 1e9,
                cpu,
            ))
        workers = []
        for place in places:
            kind = _kind(place["name"])
            if kind not in ("thread worker", "process worker", "Dask worker"):
                continue
            busy = sum(_scaled(place, s)["wall_ns"] for s in place["stages"]) / 1e9
            cpu = place["process_cpu_ns"]
            workers.append(Worker(where(place["name"]), busy, place["alive_ns"] / 1e9,
                                  None if cpu is None else cpu / 1e9))
        consumer = snapshot["consumer"]
        steps = consumer["steps"]
        # Times of the timed steps, scaled to all steps (snapshots of 0.3 timed all).
        waits = steps / consumer["timed_steps"] if consumer.get("timed_steps") else 1.0
        computes = (consumer["intervals"] / consumer["compute_steps"]
                    if consumer.get("compute_steps") else 1.0)
        queues = {
            name: {"mean": g["total"] / g["samples"] if g["samples"] else 0.0,
                   "max": g["max"], "capacity": g["capacity"]}
            for name, g in snapshot["gauges"].items()
        }
        return cls(
            snapshot["elapsed_ns"] / 1e9, snapshot["process_cpu_ns"] / 1e9, tuple(stages),
            tuple(sorted(workers, key=lambda w: w.name)), steps,
            consumer["wait_ns"] * waits / 1e9, consumer["max_wait_ns"] / 1e9,
            consumer["compute_ns"] * computes / 1e9, queues, dict(snapshot["counts"]),
            decisions=tuple(snapshot.get("decisions", ())), snapshot=snapshot,
        )

    def since(self, earlier: Stats) -> Stats:
        """What was counted between `earlier` and these stats (both of one loader)."""
        if self.snapshot is None or earlier.snapshot is None:
            return self
        return Stats.of(board_lib.difference(self.snapshot, earlier.snapshot))

    @property
    def cpu_s(self) -> float:
        """CPU seconds of this process and of the worker processes that reported theirs."""
        return self.process_cpu_s + sum(w.process_cpu_s or 0.0 for w in self.workers)

    # -- what it says ------------------------------------------------------------------
    def stage(self, name: str) -> Stage | None:
        """The stage named `name`, or None if it did not run."""
        return next((s for s in self.stages if s.name == name), None)

    @property
    def bottleneck(self) -> str | None:
        """The stage that allows the fewest records per second (None before any ran)."""
        timed = [s for s in self.stages if s.allows is not None]
        return min(timed, key=lambda s: s.allows).name if timed else None  # type: ignore[arg-type,return-value]

    @property
    def wait_share(self) -> float | None:
        """The share of the consumer's time spent waiting for data (None: not timed)."""
        total = self.wait_s + self.compute_s
        return self.wait_s / total if self.steps and total > 0 else None

    @property
    def records(self) -> int:
        """Records that left the last stage that ran."""
        return self.stages[-1].records_out if self.stages else 0

    def summary(self) -> str:
        """One line: records, rate, the bottleneck, the data wait."""
        if not self.counting:
            return f"not counted: the environment variable {meters.ENV}=0 switched counting off"
        rate = self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0
        text = f"{self.records:,} records in {self.elapsed_s:.2f} s ({rate:,.0f}/s)"
        name = self.bottleneck
        if name is not None:
            stage = self.stage(name)
            assert stage is not None and stage.allows is not None
            text += f"; bottleneck: {name} (allows {stage.allows:,.0f} records/s)"
        share = self.wait_share
        if share is not None:
            text += (f"; data wait {self.wait_s / self.steps * 1e3:.2f} ms/step "
                     f"({share:.0%} of {self.steps} steps)")
        return text

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-serialisable data (rates and the bottleneck included)."""
        return {
            "counting": self.counting,
            "elapsed_s": self.elapsed_s,
            "process_cpu_s": self.process_cpu_s,
            "bottleneck": self.bottleneck,
            "stages": [
                {**dataclasses.asdict(s), "us_per_record": s.us_per_record, "allows": s.allows}
                for s in self.stages
            ],
            "workers": [{**dataclasses.asdict(w), "busy": w.busy} for w in self.workers],
            "consumer": {"steps": self.steps, "wait_s": self.wait_s,
                         "max_wait_s": self.max_wait_s, "compute_s": self.compute_s,
                         "wait_share": self.wait_share},
            "queues": self.queues,
            "counts": self.counts,
            "decisions": [dict(d) for d in self.decisions],
        }

    def __str__(self) -> str:
        head = ("stage", "where", "batches", "records", "MB out", "wall s", "CPU s",
                "us/record", "allows rec/s")
        rows = [head]
        for s in self.stages:
            rows.append((
                s.name + (" *" if s.name == self.bottleneck else ""), s.where,
                f"{s.batches:,}", f"{s.records_in:,}",
                f"{s.bytes_out / 1e6:,.2f}" if s.bytes_out else "-", f"{s.wall_s:.3f}",
                "-" if s.cpu_s is None else f"{s.cpu_s:.3f}",
                "-" if s.us_per_record is None else f"{s.us_per_record:,.1f}",
                "-" if s.allows is None else f"{s.allows:,.0f}",
            ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [self.summary()]
        for number, row in enumerate(rows):
            cells = [c.ljust(w) if i < 2 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(row, widths, strict=True))]
            lines.append("  ".join(cells).rstrip())
            if number == 0:
                lines.append("  ".join("-" * w for w in widths))
        if self.bottleneck is not None:
            lines.append("* the bottleneck: the stage that allows the fewest records/s")
        lines += self._footer()
        return "\n".join(lines)

    def _footer(self) -> list[str]:
        lines = []
        if self.steps:
            lines.append(
                f"consumer: {self.steps:,} steps, data wait {self.wait_s:.3f} s "
                f"(longest {self.max_wait_s * 1e3:.1f} ms), between batches "
                f"{self.compute_s:.3f} s"
            )
        for name, q in self.queues.items():
            cap = "" if q["capacity"] is None else f" of {q['capacity']}"
            lines.append(f"queue {name}: {q['mean']:.1f} on average, at most {q['max']}{cap}")
        if self.workers:
            lines.append("workers: " + ", ".join(
                f"{w.name} {w.busy:.0%} busy" for w in self.workers))
        storage = {k.split(".", 1)[1]: v for k, v in self.counts.items()
                   if k.startswith("storage.")}
        gets = storage.get("gets", 0)
        if gets:
            text = (f"storage: {gets:,} GETs ({storage.get('retries', 0):,} retries), "
                    f"{storage.get('bytes', 0) / 1e6:,.2f} MB, "
                    f"{storage.get('get_ns', 0) / gets / 1e6:.1f} ms per GET")
            ranges = storage.get("ranges", 0)
            if ranges:
                text += f", {storage.get('cached', 0) / ranges:.0%} of ranges already read"
            lines.append(text)
        if storage.get("file_reads"):
            lines.append(f"files: {storage['file_reads']:,} reads, "
                         f"{storage.get('file_bytes', 0) / 1e6:,.2f} MB")
        for d in self.decisions[-3:]:
            if "readahead_bytes" in d:  # ObjectReads(readahead_bytes="auto")'s
                lines.append(f"readahead_bytes='auto' after task {d['batch']:,}: "
                             f"{d['readahead_bytes'] / 1e6:,.1f} MB ahead ({d['why']})")
                continue
            if "window" in d:  # window="auto"'s
                lines.append(f"{d.get('by', WINDOW_AUTO)} after batch {d['batch']:,}: window "
                             f"{d['window']} for {d.get('where', d['kind'])} ({d['why']})")
                continue
            lines.append(f"Workers('auto') after batch {d['batch']:,}: {d['kind']} x "
                         f"{d['num_workers']} ({d['why']})")
        lines.append(f"this process: {self.process_cpu_s:.2f} CPU s in {self.elapsed_s:.2f} s")
        return lines
