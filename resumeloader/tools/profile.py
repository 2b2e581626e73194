"""``resumeloader profile MODULE:FACTORY``: each stage's cost, the bottleneck, and settings tried.

Builds your loader (or pipeline) with every batch timed (``RESUMELOADER_STATS=all``),
consumes `batches` batches with no model (``for batch in loader``) and prints the
per-stage table of `ResumableLoader.stats` after the first batch (start-up apart):
what each stage costs per record, the records per second it allows, the bottleneck.
Then, unless told not to, it *measures* the settings that do not change the stream —
the worker kind and count, the prefetch depth — each on a fresh loader of the same
pipeline for a few batches after two warm-up batches, and recommends the fastest. For
a source read from storage it also measures the block order, which changes the order
(a new run: it is a different stream). Nothing is guessed: every figure printed was
measured in this run, on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from resumeloader.core import meters
from resumeloader.sources import base as sources_base
from resumeloader.tools import factory

__all__ = ["Trial", "main", "profile"]

#: Batches each trial consumes before it is timed (worker start-up, first conversions).
WARMUP = 2
#: Rounds of measurements per setting (interleaved; the median is kept).
ROUNDS = 3
#: A setting is recommended over the current one only when it is this much faster.
MARGIN = 1.05
#: The block size tried for a source read from storage.
BLOCK = "4MiB"


@dataclasses.dataclass(frozen=True)
class Trial:
    """One setting, measured.

    Attributes:
        setting: the loader's arguments (``workers=Workers(2, kind='process'),
            prefetch=0``).
        label: the setting in a few words (``2 process workers, prefetch 0``).
        records_per_s: records per second delivered after the warm-up.
        cpu_us_per_record: CPU microseconds per record of this process and its worker
            processes.
        bottleneck: the stage that allowed the fewest records/s in it.
        changes_order: whether it is another stream (the block order).
        error: why it could not run (then the figures are 0).
        group: ``"workers"`` (the worker settings, prefetch AUTOTUNE) or ``"prefetch"``
            (the best workers with other depths, and the block order): each group is
            measured in interleaved rounds of its own.
    """

    setting: str
    label: str
    records_per_s: float
    cpu_us_per_record: float
    bottleneck: str | None
    changes_order: bool = False
    error: str | None = None
    group: str = "workers"


@contextlib.contextmanager
def _every_batch_timed() -> Iterator[None]:
    """Within it, loaders made (and their worker processes) time every batch."""
    before = os.environ.get(meters.ENV)
    os.environ[meters.ENV] = "all"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(meters.ENV, None)
        else:
            os.environ[meters.ENV] = before


def _consume(loader: Any, batches: int) -> tuple[int, float]:
    """Consumes up to `batches` batches; returns the records and the wall seconds."""
    start_position, start = loader.position, time.perf_counter()
    for count, _ in enumerate(loader, start=1):
        if count >= batches:
            break
    return loader.position - start_position, time.perf_counter() - start


def _measure(loader: Any, batches: int) -> tuple[Trial, Any]:
    """`loader`'s figures over `batches` batches after `WARMUP` (its `Stats` beside)."""
    _consume(loader, WARMUP)
    before = loader.stats()
    records, wall = _consume(loader, batches)
    stats = loader.stats().since(before)
    rate = records / wall if wall > 0 else 0.0
    cpu = stats.cpu_s * 1e6 / records if records else 0.0
    return Trial("", "", rate, cpu, stats.bottleneck), stats


def _setting(workers: Any, prefetch: Any) -> tuple[str, str]:
    """The loader arguments of a setting, and the setting in a few words."""
    from resumeloader.tfdata import loader as loader_lib

    depth = "AUTOTUNE" if prefetch == loader_lib.AUTOTUNE else str(prefetch)
    count = workers.num_workers
    if workers.kind == "auto":  # chosen as it runs: named as given
        code, label = f"workers={workers!r}, prefetch={depth}", f"{workers!r}, prefetch {depth}"
    elif count:
        code = f"workers=Workers({count}, kind={workers.kind!r}), prefetch={depth}"
        label = f"{count} {workers.kind} worker{'s' if count != 1 else ''}, prefetch {depth}"
    else:
        code, label = f"workers=Workers(), prefetch={depth}", f"no workers, prefetch {depth}"
    return code, label


class _Candidate:
    """One setting's loader, kept open over the rounds, and what each round measured."""

    def __init__(self, made: Any, pipeline: Any, workers: Any, prefetch: Any, *,
                 changes_order: bool = False) -> None:
        from resumeloader.tfdata import loader as loader_lib

        self.workers, self.prefetch, self.changes_order = workers, prefetch, changes_order
        self.setting, self.label = _setting(workers, prefetch)
        if changes_order:
            self.setting = f"pipeline.shuffle(block={BLOCK!r}), {self.setting}"
            self.label = f"block order {BLOCK}, {self.label}"
        self.runs: list[Trial] = []
        self.error: str | None = None
        self.loader: Any = None
        try:
            self.loader = loader_lib.ResumableLoader.from_pipeline(
                pipeline, num_epochs=None, shard=made.shard, workers=workers,
                prefetch=prefetch, with_metadata=made.with_metadata,
            )
        except Exception as err:  # a setting that cannot run here
            self.error = f"{type(err).__name__}: {err}"

    def run(self, batches: int) -> None:
        """Measures one round (the first after `WARMUP` batches)."""
        if self.error is not None:
            return
        try:
            if not self.runs:
                _consume(self.loader, WARMUP)
            self.runs.append(_measure(self.loader, batches)[0])
        except Exception as err:  # e.g. unpicklable code in worker processes
            self.error = f"{type(err).__name__}: {err}"
            self.close()

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()

    def trial(self) -> Trial:
        """The median round (by records/s)."""
        if self.error is not None or not self.runs:
            return Trial(self.setting, self.label, 0.0, 0.0, None, self.changes_order,
                         self.error or "not measured")
        median = sorted(self.runs, key=lambda t: t.records_per_s)[len(self.runs) // 2]
        return dataclasses.replace(median, setting=self.setting, label=self.label,
                                   changes_order=self.changes_order)


def _rounds(candidates: list[_Candidate], rounds: int, batches: int) -> list[Trial]:
    """Each candidate measured `rounds` times, interleaved (a burst of load on the machine
    hits them alike), closed after; their median trials."""
    try:
        for _ in range(rounds):
            for candidate in candidates:
                candidate.run(batches)
    finally:
        for candidate in candidates:
            candidate.close()
    return [candidate.trial() for candidate in candidates]


def _candidates(current: Any) -> list[Any]:
    """The worker settings tried: none, threads and processes (2, and one per core)."""
    from resumeloader import Workers

    cores = os.cpu_count() or 1
    counts = sorted({2, max(2, cores)})
    out = [current, Workers()]
    for kind in ("thread", "process"):
        out += [Workers(count, kind=kind) for count in counts]
    unique = []
    for workers in out:
        if workers not in unique:
            unique.append(workers)
    return unique


def _block_order(pipeline: Any, baseline: Any) -> Any:
    """The pipeline in the block order, if its source is read from storage and it is
    shuffled globally (else None)."""
    from resumeloader.stages import sampler

    stage = pipeline.index_stage
    prefetches = sources_base.optional(pipeline.source, "prefetch") is not None
    reads_storage = baseline.counts.get("storage.gets", 0) > 0 or prefetches
    if not (reads_storage and isinstance(stage, sampler.SamplerStage) and stage.shuffle):
        return None
    try:
        return pipeline.shuffle(block=BLOCK)
    except (TypeError, ValueError):
        return None


def profile(spec: str, *, batches: int = 50, tune: bool = True,
            trial_batches: int | None = None, rounds: int = ROUNDS) -> dict[str, Any]:
    """Profiles the loader `spec` (``MODULE:FACTORY``) builds; see the module docstring.

    Returns:
        ``stats`` (the `Stats` of the first loader after its first batch), ``trials``
        (a `Trial` per setting measured: the worker settings, the current one first,
        then the chosen workers' prefetch depths, AUTOTUNE first), ``recommended`` (the
        current trial, or the fastest that keeps the stream when it is `MARGIN` faster;
        None without `tune`) and ``speedup`` (its records/s over the current ones').
    """
    from resumeloader.tfdata import loader as loader_lib

    with _every_batch_timed():
        made = factory.loader_of(factory.build(spec))
        with made:
            _consume(made, 1)
            before = made.stats()
            _consume(made, max(1, batches - 1))
            stats = made.stats().since(before)
        per_trial = trial_batches or max(10, batches // 2)
        if not tune:
            return {"stats": stats, "trials": [], "recommended": None, "speedup": None,
                    "trial_batches": per_trial}
        pipeline = made.pipeline
        options = _candidates(made.workers)
        trials = _rounds([_Candidate(made, pipeline, w, loader_lib.AUTOTUNE) for w in options],
                         rounds, per_trial)
        current = trials[0]
        ran = [t for t in trials if t.error is None]
        best = max(ran, key=lambda t: t.records_per_s) if ran else current
        chosen = best if best.records_per_s >= MARGIN * current.records_per_s else current
        workers = options[trials.index(chosen)]
        # The chosen workers again, in the same rounds as the depths compared with them.
        group = [_Candidate(made, pipeline, workers, depth)
                 for depth in (loader_lib.AUTOTUNE, 0, 8)]
        blocked = _block_order(pipeline, stats)
        if blocked is not None:
            group.append(_Candidate(made, blocked, workers, loader_lib.AUTOTUNE,
                                    changes_order=True))
        again = [dataclasses.replace(t, group="prefetch")
                 for t in _rounds(group, rounds, per_trial)]
    trials += again
    base = again[0]
    kept = [t for t in again if t.error is None and not t.changes_order]
    deeper = max(kept, key=lambda t: t.records_per_s) if kept else base
    if deeper.records_per_s < MARGIN * base.records_per_s:
        deeper = base
    speedup = (chosen.records_per_s / (current.records_per_s or 1.0)
               * deeper.records_per_s / (base.records_per_s or 1.0))
    recommended = current if chosen is current and deeper is base else deeper
    return {"stats": stats, "trials": trials, "recommended": recommended, "speedup": speedup,
            "trial_batches": per_trial}


def main(spec: str, out: Console, *, batches: int = 50, tune: bool = True,
         trial_batches: int | None = None, as_json: bool = False) -> int:
    """Runs `profile` and prints its report (a table, or one JSON object); returns 0."""
    result = profile(spec, batches=batches, tune=tune, trial_batches=trial_batches)
    stats, trials, best = result["stats"], result["trials"], result["recommended"]
    if as_json:
        data = {"stats": stats.to_dict(), "trials": [dataclasses.asdict(t) for t in trials],
                "recommended": None if best is None else best.setting,
                "speedup": result.get("speedup")}
        out.print(json.dumps(data), soft_wrap=True, markup=False, highlight=False)
        return 0
    out.print(f"resumeloader profile {spec}: {batches - 1} batches after the first, every "
              "batch timed, no model", markup=False, soft_wrap=True)
    out.print(str(stats), markup=False, highlight=False, soft_wrap=True)
    if stats.bottleneck is not None:
        stage = stats.stage(stats.bottleneck)
        assert stage is not None and stage.allows is not None
        out.print(f"bottleneck: {stage.name} ({stage.where}): allows {stage.allows:,.0f} "
                  "records/s", markup=False, soft_wrap=True)
    if not trials:
        return 0
    workers = [t for t in trials if t.group == "workers"]
    depths = [t for t in trials if t.group == "prefetch"]
    head = (f"on fresh loaders of the same pipeline: {WARMUP} warm-up batches, then "
            f"{ROUNDS} interleaved rounds of {result['trial_batches']} batches (the median)")
    out.print(f"Workers (prefetch AUTOTUNE), {head}:", markup=False, soft_wrap=True)
    out.print(_table(workers, "vs current", current=True), markup=False, highlight=False,
              soft_wrap=True)
    out.print(f"Prefetch depths with {depths[0].label.split(', prefetch')[0]}, {head}:",
              markup=False, soft_wrap=True)
    out.print(_table(depths, "vs AUTOTUNE"), markup=False, highlight=False, soft_wrap=True)
    assert best is not None
    if best is trials[0]:
        out.print(f"Recommendation (measured): keep the current workers ({best.label}); "
                  f"nothing tried was {MARGIN - 1:.0%} faster.", markup=False, soft_wrap=True)
    else:
        out.print(f"Recommendation (measured): {best.setting} ({result['speedup']:.2f}x the "
                  "current workers' records/s). The stream is the same with any workers and "
                  "prefetch.", markup=False, soft_wrap=True)
    blocked = [t for t in depths if t.changes_order and t.error is None]
    if blocked:
        ratio = blocked[0].records_per_s / (depths[0].records_per_s or 1.0)
        out.print(f"The block order measured {ratio:.2f}x the global shuffle; it changes the "
                  "order (a new run: a checkpoint of the current order does not restore into "
                  "it).", markup=False, soft_wrap=True)
    return 0


def _table(trials: list[Trial], versus: str, *, current: bool = False) -> str:
    """The trials as a plain text table (one line each, never wrapped), rates relative
    to the first."""
    base = trials[0].records_per_s or 1.0
    rows = [("setting", "records/s", "CPU us/record", versus, "bottleneck")]
    for number, trial in enumerate(trials):
        name = trial.label + (" (current)" if current and number == 0 else "")
        if trial.error is not None:
            rows.append((name, "-", "-", "-", f"failed: {trial.error[:60]}"))
            continue
        rows.append((name, f"{trial.records_per_s:,.0f}", f"{trial.cpu_us_per_record:,.1f}",
                     f"{trial.records_per_s / base:.2f}x", trial.bottleneck or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [cell.ljust(width) if i in (0, 4) else cell.rjust(width)
                 for i, (cell, width) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)
