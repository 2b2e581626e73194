"""``resumeloader show``: which records were (or will be) in the batches of given steps.

``resumeloader show CHECKPOINT --pipeline module:function --steps 340:346`` builds the
pipeline of your training script (``function()`` returns a `Pipeline` or a
`ResumableLoader`; `resumeloader.tools.factory` finds it), restores the checkpoint's
loader state into it (so a pipeline whose data history differs from the run's in the
past is refused, naming the amendment) and prints the records of each batch
(`ResumableLoader.records_at`): nothing is trained and no batch before them is
computed.

A tool for pipes and terminals alike:

* TensorFlow is imported only if your function imports it (a `Pipeline` needs it
  not; a `ResumableLoader` does), and the checkpoint is read without it
  (`resumeloader.tools.inspect`);
* rows are streamed batch by batch, so any range (``--steps 0:1000000000 | head``)
  answers at once in bounded memory; a finite run's range ends at its last batch;
* ``--format table`` (aligned columns; on a terminal, long file names are shortened
  in the middle to fit unless ``--wide``; never when writing to a file or a pipe),
  ``tsv`` (tab-separated, a header line) or ``json`` (one JSON line per batch).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Iterator
from typing import IO, Any

from rich.console import Console

from resumeloader.handout import lineage, resume
from resumeloader.stages import plan as plan_lib
from resumeloader.tools import factory, quiet
from resumeloader.tools import inspect as inspect_lib
from resumeloader.workers import produce

__all__ = ["FORMATS", "main", "parse_range"]

FORMATS = ("table", "tsv", "json")
_COLUMNS = ("step", "epoch", "position", "index", "source", "lap", "record", "file",
            "file_record")
_LEFT = ("source", "file")
_CHUNK = 64  # steps looked up at once
_WIDTH_ROWS = 64  # rows a table's column widths are taken from


def parse_range(option: str, text: str) -> range:
    """``"340:346"`` as ``range(340, 346)``, ``"340"`` as ``range(340, 341)``.

    Raises:
        ValueError: anything else.
    """
    try:
        if ":" in text:
            first, _, last = text.partition(":")
            numbers = range(int(first), int(last))
            if int(first) < 0 or not numbers:
                raise ValueError(text)
            return numbers
        if int(text) < 0:
            raise ValueError(text)
        return range(int(text), int(text) + 1)
    except ValueError as err:
        msg = (
            f"{option} must be N or START:STOP (non-negative, START < STOP). "
            f"Received: {option} {text!r}."
        )
        raise ValueError(msg) from err


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def _load(spec: str) -> factory.Made:
    """What ``MODULE:FUNCTION`` builds (`resumeloader.tools.factory`), the start-up lines
    of a TensorFlow it imports kept out of the output."""
    with quiet.startup_filtered() if "tensorflow" not in sys.modules else _nothing():
        return factory.build(spec, option="--pipeline")


def _restored(made: factory.Made, state: dict[str, Any]) -> tuple[plan_lib.Plan, int]:
    """The plan of what the function made, and the position `state` names in it."""
    if made.loader is None:  # a Pipeline: no loader, so no TensorFlow
        producer = produce.BatchProducer(made.plan.pipeline)
        return made.plan, resume.resume(made.plan, producer, state)
    made.loader.set_state(state)
    return made.loader.plan, made.loader.position


def _batches(
    plan: plan_lib.Plan, *, steps: range | None, positions: range | None, position: int
) -> Iterator[lineage.BatchRecords]:
    """The `BatchRecords` asked for, one at a time (bounded memory for any range)."""
    producer = produce.BatchProducer(plan.pipeline)
    layout = plan.layout
    if steps is not None:
        total = layout.batches_to_end(0) if layout.known_counts else None
        stop = steps.stop if total is None else max(min(steps.stop, total), steps.start + 1)
        for start in range(steps.start, stop, _CHUNK):
            chunk = range(start, min(start + _CHUNK, stop))
            yield from lineage.records_at(plan, producer, steps=chunk, positions=None)
        return
    if positions is None:
        positions = range(position, position + 1)
    if len(positions) == 1:
        yield from lineage.records_at(plan, producer, steps=None, positions=[positions[0]])
        return
    at, end = layout.normalise(positions.start), layout.end
    while at < positions.stop and (end is None or at < end):
        [found] = lineage.records_at(plan, producer, steps=None, positions=[at])
        yield found
        at = found.stop


def _rows(batches: Iterator[lineage.BatchRecords]) -> Iterator[list[str]]:
    for batch in batches:
        for record in batch.records:
            row = {"step": batch.step, "epoch": batch.epoch, **record}
            yield [inspect_lib.printable("" if row.get(c) is None else str(row[c]))
                   for c in _COLUMNS]


def _shorten(text: str, width: int) -> str:
    """`text` cut in the middle to `width` characters (an ellipsis where it was cut)."""
    if len(text) <= width:
        return text
    keep = max(width - 1, 2)
    return text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2) :]


def _write_table(rows: Iterator[list[str]], file: IO[str], *, fit: int | None) -> None:
    """Aligned columns; widths from the header and the first rows. With `fit` (a
    terminal's width), the file column is shortened to make the line fit."""
    head = list(itertools.islice(rows, _WIDTH_ROWS))
    widths = [max([len(c)] + [len(r[i]) for r in head]) for i, c in enumerate(_COLUMNS)]
    if fit is not None:
        file_column = _COLUMNS.index("file")
        others = sum(widths) - widths[file_column] + 2 * (len(widths) - 1)
        widths[file_column] = max(min(widths[file_column], fit - others), 8)

    def line(cells: list[str]) -> str:
        shown = []
        for name, cell, width in zip(_COLUMNS, cells, widths, strict=True):
            if fit is not None and name == "file":
                cell = _shorten(cell, width)
            shown.append(cell.ljust(width) if name in _LEFT else cell.rjust(width))
        return "  ".join(shown).rstrip() + "\n"

    file.write(line(list(_COLUMNS)))
    for cells in itertools.chain(head, rows):
        file.write(line(cells))


def main(
    checkpoint: str,
    out: Console,
    *,
    pipeline: str,
    steps: str | None,
    positions: str | None,
    batch_size: int | None,
    output_format: str = "table",
    wide: bool = False,
    key: str | None = None,
) -> int:
    """Prints the records of the batches asked for; returns the exit status."""
    if steps is not None and positions is not None:
        msg = "Give --steps or --positions, not both."
        raise ValueError(msg)
    if output_format not in FORMATS:
        msg = f"--format must be one of {', '.join(FORMATS)}. Received: {output_format!r}."
        raise ValueError(msg)
    step_range = None if steps is None else parse_range("--steps", steps)
    position_range = None if positions is None else parse_range("--positions", positions)
    _, states = inspect_lib.find_states(checkpoint)
    if key is not None:
        states = {k: v for k, v in states.items() if k == key}
    if len(states) != 1:
        shown = ", ".join(map(inspect_lib.printable, states)) or "none"
        msg = (
            "The checkpoint must hold exactly one loader state (or name one with --key). "
            f"Received: {shown}."
        )
        raise ValueError(msg)
    plan, position = _restored(_load(pipeline), next(iter(states.values())))
    if batch_size is not None and batch_size != plan.batch_size:
        plan = plan.sharded(plan.shard, batch_size=batch_size)
    batches = _batches(plan, steps=step_range, positions=position_range, position=position)
    try:
        first = next(batches)  # a usage error (e.g. steps of a packing stage) before output
    except TypeError as err:
        raise ValueError(str(err)) from err
    batches = itertools.chain([first], batches)
    file = out.file
    if output_format == "json":
        for batch in batches:
            file.write(batch.to_json() + "\n")
        return 0
    if output_format == "tsv":
        file.write("\t".join(_COLUMNS) + "\n")
        for cells in _rows(batches):
            file.write("\t".join(cells) + "\n")
        return 0
    file.write(f"records of the batches asked for (checkpoint at position {position})\n")
    _write_table(_rows(batches), file, fit=None if wide or not out.is_terminal else out.width)
    return 0
