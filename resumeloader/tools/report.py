"""`ResumeReport`: the traces of killed-and-restarted processes, stitched and compared.

Stitching rule: process i+1 starts at step r (what its restored checkpoint had
completed). Steps >= r that process i recorded were not in that checkpoint, so they
are superseded by process i+1's records (counted as *re-run*, which is legitimate).
Resuming below a step some process committed means a durable checkpoint was lost;
resuming above the last step recorded means steps ran that no trace holds. Both are
reported as problems, as is any process that crashed.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from resumeloader.tools import trace as trace_lib

__all__ = ["ResumeReport", "RunOutcome", "build"]


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """One process of a harness run: its trace and how it ended."""

    name: str
    trace: trace_lib.Trace
    pause_at: str | None
    killed: bool
    returncode: int | None
    log_tail: str = ""


@dataclasses.dataclass(frozen=True)
class Kill:
    """One kill: where it was requested, the last step run, where the next process resumed."""

    point: str
    last_step: int
    last_commit: int | None
    resumed_at: int | None


@dataclasses.dataclass(frozen=True)
class ResumeReport:
    """The comparison of a killed-and-restarted training run with an uninterrupted one.

    ``identical`` is True only when every step of the stitched resumed run trained
    on the same record ids and batch bytes as the reference, both runs have the
    same number of steps, the final weights digests agree (when recorded), and no
    protocol problem (crash, lost checkpoint, unreached kill point) occurred.
    ``str(report)`` is a readable side-by-side table.
    """

    reference_steps: int
    resumed_steps: int
    processes: int
    kills: tuple[Kill, ...]
    steps_rerun: int
    records_lost: int
    records_duplicated: int
    records_moved: int
    batches_differing: int
    digests_differing: int
    reference_loss: float | None
    resumed_loss: float | None
    reference_weights: str | None
    resumed_weights: str | None
    first_difference: str | None
    problems: tuple[str, ...]
    workdir: str = ""

    @property
    def weights_identical(self) -> bool | None:
        """Whether the final weights are bit-identical; None when not recorded."""
        if self.reference_weights is None or self.resumed_weights is None:
            return None
        return self.reference_weights == self.resumed_weights

    @property
    def identical(self) -> bool:
        """True when the resumed run is indistinguishable from the uninterrupted one."""
        return (
            not self.problems
            and self.reference_steps == self.resumed_steps
            and self.records_lost == self.records_duplicated == self.records_moved == 0
            and self.batches_differing == self.digests_differing == 0
            and self.weights_identical is not False
        )

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, uninterrupted, killed and resumed) rows of the table."""
        same = {True: "yes", False: "NO", None: "-"}
        return [
            ("processes", "1", str(self.processes)),
            ("SIGKILLs", "-", str(len(self.kills))),
            ("steps", str(self.reference_steps), str(self.resumed_steps)),
            ("steps re-run after a kill", "-", str(self.steps_rerun)),
            ("records lost", "-", str(self.records_lost)),
            ("records duplicated", "-", str(self.records_duplicated)),
            ("records moved to another step", "-", str(self.records_moved)),
            ("batches with other records", "-", str(self.batches_differing)),
            ("batches with other bytes", "-", str(self.digests_differing)),
            ("final loss", _fmt(self.reference_loss), _fmt(self.resumed_loss)),
            ("final weights digest", self.reference_weights or "-", self.resumed_weights or "-"),
            ("final weights bit-identical", "-", same[self.weights_identical]),
        ]

    def __str__(self) -> str:
        rows = [("", "uninterrupted", "killed+resumed"), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"resume check: {'IDENTICAL' if self.identical else 'DIFFERENT'}"]
        lines += [f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in rows]
        lines += [f"  {line}" for line in self.details()]
        return "\n".join(lines)

    def details(self) -> list[str]:
        """The lines under the table: each kill, the first difference, problems, workdir."""
        lines = [
            f"SIGKILL at {kill.point}: last step run {kill.last_step}, last committed "
            f"checkpoint {kill.last_commit}, resumed at step {kill.resumed_at}"
            for kill in self.kills
        ]
        if self.first_difference:
            lines.append(f"first difference: {self.first_difference}")
        lines += [f"problem: {p}" for p in self.problems]
        if self.workdir:
            lines.append(f"traces, logs and checkpoints: {self.workdir}")
        return lines


def _fmt(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.8g}"


def _ids(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 8 else f"[{', '.join(map(str, ids[:8]))}, ...] ({len(ids)})"


def _stitch(
    attempts: list[RunOutcome], problems: list[str]
) -> tuple[dict[int, Any], int, list[Kill]]:
    stitched: dict[int, Any] = {}
    rerun = 0
    committed: int | None = None
    kills: list[Kill] = []
    for i, run in enumerate(attempts):
        trace = run.trace
        start = trace.start if trace.start is not None else min(trace.steps, default=None)
        if i > 0:
            prev = attempts[i - 1]
            kills.append(Kill(str(prev.pause_at), prev.trace.last_step, committed, start))
        if start is None:
            if run.killed:
                problems.append(f"{run.name} was killed before it recorded its start.")
            continue
        if committed is not None and start < committed:
            problems.append(
                f"{run.name} resumed at step {start} although step {committed} was committed: "
                "a durable checkpoint was lost."
            )
        if start > len(stitched):
            problems.append(
                f"{run.name} resumed at step {start} but only steps 0..{len(stitched) - 1} "
                "were recorded: steps ran that no trace holds."
            )
        superseded = [k for k in stitched if k >= start]
        rerun += len(superseded)
        for k in superseded:
            del stitched[k]
        stitched.update({k: e for k, e in trace.steps.items() if k >= start})
        if trace.commits:
            committed = max(trace.commits[-1], committed or 0)
    return stitched, rerun, kills


def _check_run(run: RunOutcome, problems: list[str], *, final: bool) -> None:
    if not run.killed and run.returncode != 0:
        problems.append(
            f"{run.name} exited with code {run.returncode}. Last output:\n{run.log_tail}"
        )
    elif run.pause_at is not None and not run.killed:
        problems.append(f"{run.name} never reached its kill point {run.pause_at}.")
    elif final and run.trace.start is None and not run.trace.steps:
        problems.append(
            f"{run.name} wrote no trace: does it record with TraceRecorder.from_env() "
            "(see the contract in docs/guides/proving-it.md)?"
        )
    elif final and run.trace.end is None:
        problems.append(f"{run.name} ended without recording the end of training.")


def build(reference: RunOutcome, attempts: list[RunOutcome], *, workdir: str = "") -> ResumeReport:
    """Stitches the attempts' traces and compares them with the reference's."""
    problems: list[str] = []
    _check_run(reference, problems, final=True)
    for i, run in enumerate(attempts):
        _check_run(run, problems, final=i == len(attempts) - 1)
    stitched, rerun, kills = _stitch(attempts, problems)
    expected = [reference.trace.steps[k] for k in sorted(reference.trace.steps)]
    received = [stitched[k] for k in sorted(stitched)]
    want = collections.Counter(r for e in expected for r in e["records"])
    got = collections.Counter(r for e in received for r in e["records"])
    differing = digests = misplaced = 0
    first = None
    for step in range(max(len(expected), len(received))):
        a = reference.trace.steps.get(step)
        b = stitched.get(step)
        here = collections.Counter(b["records"] if b else [])
        misplaced += sum((here - collections.Counter(a["records"] if a else [])).values())
        same_ids = a is not None and b is not None and a["records"] == b["records"]
        same_bytes = a is not None and b is not None and a["digest"] == b["digest"]
        differing += not same_ids
        digests += same_ids and not same_bytes
        if first is None and not (same_ids and same_bytes):
            first = (
                f"step {step}: expected "
                + ("nothing" if a is None else f"records {_ids(a['records'])} ({a['digest']})")
                + ", received "
                + ("nothing" if b is None else f"records {_ids(b['records'])} ({b['digest']})")
            )
    ref_end = reference.trace.end or {}
    res_end = attempts[-1].trace.end or {} if attempts else {}
    return ResumeReport(
        reference_steps=len(expected),
        resumed_steps=len(received),
        processes=len(attempts),
        kills=tuple(kills),
        steps_rerun=rerun,
        records_lost=sum((want - got).values()),
        records_duplicated=sum((got - want).values()),
        # Records at a step where the reference did not have them, beyond the extra copies.
        records_moved=misplaced - sum((got - want).values()),
        batches_differing=differing,
        digests_differing=digests,
        reference_loss=ref_end.get("loss"),
        resumed_loss=res_end.get("loss"),
        reference_weights=ref_end.get("weights"),
        resumed_weights=res_end.get("weights"),
        first_difference=first,
        problems=tuple(problems),
        workdir=workdir,
    )
