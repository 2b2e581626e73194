"""``resumeloader show``: which records were (or will be) in the batches of given steps.

``resumeloader show CHECKPOINT --pipeline module:function --steps 340:346`` builds the
loader of your training script (``function()`` returns a `ResumableLoader` or a
`Pipeline`), restores the checkpoint's loader state into it (so a pipeline whose data
history differs from the run's in the past is refused, naming the amendment) and
prints the records of each batch (`ResumableLoader.records_at`): a table, or with
``--json`` one JSON line per batch. Nothing is trained and no batch before them is
computed.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from resumeloader.tools import factory
from resumeloader.tools import inspect as inspect_lib

__all__ = ["main", "parse_range"]

_COLUMNS = ("step", "epoch", "position", "index", "source", "lap", "record", "file",
            "file_record")


def parse_range(option: str, text: str) -> range | list[int]:
    """``"340:346"`` as ``range(340, 346)``, ``"340"`` as ``[340]``.

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
        return [int(text)]
    except ValueError as err:
        msg = (
            f"{option} must be N or START:STOP (non-negative, START < STOP). "
            f"Received: {option} {text!r}."
        )
        raise ValueError(msg) from err


def main(
    checkpoint: str,
    out: Console,
    *,
    pipeline: str,
    steps: str | None,
    positions: str | None,
    batch_size: int | None,
    as_json: bool,
    key: str | None = None,
) -> int:
    """Prints the records of the batches asked for; returns the exit status."""
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
    loader = factory.loader_of(factory.build(pipeline, option="--pipeline"))
    loader.set_state(next(iter(states.values())))
    if steps is not None and positions is not None:
        msg = "Give --steps or --positions, not both."
        raise ValueError(msg)
    try:
        if steps is not None:
            found = loader.records_at(parse_range("--steps", steps), batch_size=batch_size)
        else:
            where = parse_range("--positions", positions) if positions else [loader.position]
            found = loader.records_at(positions=where, batch_size=batch_size)
    except TypeError as err:  # a usage error: e.g. steps of a packing stage
        raise ValueError(str(err)) from err
    if as_json:
        for batch in found:
            print(batch.to_json())
        return 0
    table = Table(title=f"records of {len(found)} batch{'es' if len(found) != 1 else ''} "
                  f"(checkpoint at position {loader.position})")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column in ("source", "file") else "right")
    for batch in found:
        for record in batch.records:
            row = {"step": batch.step, "epoch": batch.epoch, **record}
            cells = ("" if row.get(c) is None else str(row[c]) for c in _COLUMNS)
            table.add_row(*map(inspect_lib.printable, cells))
    out.print(table)
    return 0
