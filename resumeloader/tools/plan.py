"""``resumeloader plan``: what a run's order will read and how well it shuffles, without reading.

``resumeloader plan MODULE:FACTORY --steps A:B`` builds your loader (or pipeline) the
way ``show`` does (`resumeloader.tools.factory`) and, for each shard and group of
steps, prints the objects or files the batches touch, the GETs and bytes the storage
layer will send after merging and caching, the local reads, the read-ahead and cache
those steps need (`resumeloader.tools.plan_reads`), and the order's shuffle score
beside tf.data's ``list_files`` + ``interleave`` + ``shuffle(buffer)`` at the given
settings (`resumeloader.tools.shuffle_score`, `resumeloader.tools.tfdata_order`).
No record is read and TensorFlow is not imported unless your module imports it.

A table on a terminal (names shortened), full names otherwise; with ``--json``
one JSON object per line: a ``row`` per shard and group of steps as it is done, a
``total``, then a ``shuffle`` line for the ``loader``'s order and one for ``tf.data``'s.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator

import numpy as np
from rich.console import Console
from rich.table import Table

from resumeloader.stages import plan as plan_lib
from resumeloader.tools import factory, plan_reads, shuffle_score, tfdata_order
from resumeloader.tools import inspect as inspect_lib

__all__ = ["SCORED", "main", "score_orders"]

#: The most positions the shuffle scores cover (from the first step asked for).
SCORED = 1 << 20


def _steps(text: str | None, plan: plan_lib.Plan) -> tuple[int, int]:
    if text is None:  # the first epoch
        return 0, plan.layout.batches_per_epoch if plan.layout.known_counts else 1
    first, sep, stop = text.partition(":")
    try:
        steps = (int(first), int(stop)) if sep else (int(first), int(first) + 1)
    except ValueError:
        steps = (-1, -1)
    if steps[0] < 0 or steps[1] <= steps[0]:
        msg = f"--steps must be N or START:STOP (0 <= START < STOP). Received: --steps {text!r}."
        raise ValueError(msg)
    return steps


def _shards(text: str | None, count: int) -> list[int]:
    if text is None or text == "all":
        return list(range(count))
    try:
        found = [int(part) for part in text.split(",")]
    except ValueError:
        found = [-1]
    if not found or any(not 0 <= s < count for s in found):
        msg = (
            f"--shards must be 'all' or shard indices in [0, {count}) separated by commas. "
            f"Received: --shards {text!r}."
        )
        raise ValueError(msg)
    return found


def score_orders(
    plan: plan_lib.Plan, steps: tuple[int, int], compared: tfdata_order.TFDataShuffle
) -> dict[str, shuffle_score.ShuffleScore] | None:
    """The shuffle scores of the plan's order and of tf.data's at `compared`, over the
    same positions of the global order (one shard): those of `steps`' first epoch, at
    most `SCORED` of them (the epoch's first ones when `steps` lie deeper than tf.data
    can be simulated cheaply); None for an order that is not one source's (a mixture).
    """
    source = plan.pipeline.source
    if plan.pipeline.index_stage.num_records != len(source) or not plan.layout.known_counts:
        return None
    whole = plan_reads.shard_plan(plan, 0, 1)
    size, count = whole.batch_size, plan.shard.count
    start, stop = plan_reads.step_positions(plan, *steps)
    epoch, offset = divmod(start, plan.records_per_epoch)
    first = offset * count // size * size
    last = min(whole.records_per_epoch, (stop - epoch * plan.records_per_epoch) * count)
    last = min(max(last, first + size), first + SCORED, whole.records_per_epoch)
    if last > 4 * SCORED:  # tf.data's buffer would have to be simulated from the start
        first, last = 0, min(SCORED, whole.records_per_epoch)
    per_file = source.records_per_file() or [len(source)]
    theirs = compared.order(per_file, seed=plan.pipeline.seed, epoch=epoch, limit=last)
    counters = {name: shuffle_score.ScoreCounter(len(source), size) for name in ("ours", "tf")}
    for at in range(first, last, size):
        end = min(at + size, last)
        positions = np.arange(at, end)
        counters["ours"].add(positions, whole.indices(epoch, at, end))
        counters["tf"].add(positions, theirs[at:end])
    return {name: counter.result() for name, counter in counters.items()}


def main(
    spec: str, out: Console, *, steps: str | None = None, every: int | None = None,
    shards: str | None = None, shard_count: int | None = None, as_json: bool = False,
    buffer_size: int = 10_000, cycle_length: int | None = None, block_length: int = 1,
) -> int:
    """Prints the plan of `spec`'s loader (see the module docstring); returns the exit status."""
    made = factory.build(spec)
    plan = made.plan
    count = plan.shard.count if shard_count is None else shard_count
    if count < 1:
        msg = f"--shard-count must be a positive integer. Received: --shard-count {count}."
        raise ValueError(msg)
    chosen = _shards(shards, count)
    base = plan_reads.shard_plan(plan, chosen[0], count)
    first, stop = _steps(steps, base)
    if every is not None and every < 1:
        msg = f"--every must be a positive number of steps. Received: --every {every}."
        raise ValueError(msg)
    every = every or max(1, math.ceil((stop - first) / 10))
    files = base.pipeline.source.records_per_file() or [len(base.pipeline.source)]
    compared = tfdata_order.TFDataShuffle(
        buffer_size, cycle_length or min(len(files), os.cpu_count() or 1), block_length,
    )
    in_process = made.loader is None or made.loader.workers.kind in ("inline", "thread")
    rows = plan_reads.read_rows(plan, steps=(first, stop), every=every, shards=chosen,
                                shard_count=count, read_ahead=in_process)
    total = _emit_json(rows) if as_json else _table(rows, out, first, stop, every)
    scores = score_orders(base, (first, stop), compared)
    if as_json:
        for order, score in (scores or {}).items():
            name, described = (("loader", plan.pipeline.index_stage.describe()) if order == "ours"
                               else ("tf.data", compared.describe()))
            line = {"kind": "shuffle", "order": name, "description": described, **score.to_dict()}
            print(json.dumps(line), flush=True)
        return 0
    _advice(total, out)
    if scores is not None:
        _score_table(scores, plan, compared, out)
    return 0


def _emit_json(rows: Iterator[plan_reads.Row]) -> plan_reads.Row | None:
    total = None
    for row in rows:
        print(json.dumps({"kind": "row", **row.to_dict()}), flush=True)
        total = _added(total, row)
    if total is not None:
        print(json.dumps({"kind": "total", **total.to_dict()}), flush=True)
    return total


def _added(total: plan_reads.Row | None, row: plan_reads.Row) -> plan_reads.Row:
    if total is None:
        total = plan_reads.Row(-1, row.first_step, first_epoch=row.first_epoch)
    total.add(row)
    total.first_step = min(total.first_step, row.first_step)
    return total


def _size(value: float | None) -> str:
    if value is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""


def _names(files: list[str], terminal: bool) -> str:
    """The first and last of `files` (base names on a terminal, else in full)."""
    shown = [inspect_lib.printable(f if not terminal else f.rstrip("/").rsplit("/", 1)[-1])
             for f in files]
    if len(shown) <= 2:
        return ", ".join(shown)
    return f"{len(shown)}: {min(shown)} .. {max(shown)}"


def _requests(row: plan_reads.Row) -> str:
    parts = [f"{row.gets:,} GET"] if row.gets or not row.preads else []
    return " + ".join([*parts, *([f"{row.preads:,} pread"] if row.preads else [])])


_COLUMNS = ("shard", "steps", "epoch", "records", "objects / files", "requests", "bytes read",
            "per record byte", "read-ahead", "cache", "re-read")


def _cells(row: plan_reads.Row, terminal: bool) -> list[str]:
    epochs = f"{row.first_epoch}" + (f"-{row.last_epoch}" if row.last_epoch > row.first_epoch
                                     else "")
    cells = [str(row.shard) if row.shard >= 0 else "all", f"{row.first_step}:{row.stop_step}",
             epochs, f"{row.records:,}"]
    if not row.predicted:
        return [*cells, "not predicted: the source cannot tell its reads", *[""] * 6]
    read = row.get_bytes + row.pread_bytes
    ratio = f"{read / row.record_bytes:.2f}" if row.record_bytes else ""
    return [
        *cells, _names(row.files, terminal), _requests(row), _size(read), ratio,
        _size(row.readahead_bytes) if row.gets else "", _cache(row) if row.gets else "",
        _size(row.reread_bytes) if row.gets else "",
    ]


def _cache(row: plan_reads.Row) -> str:
    """The cache need: more than the plan follows when an epoch reuses a span farther."""
    return f"> {_size(row.cache_followed)}" if row.cache_beyond else _size(row.cache_bytes)


def _table(
    rows: Iterator[plan_reads.Row], out: Console, first: int, stop: int, every: int
) -> plan_reads.Row | None:
    terminal = out.is_terminal
    table = Table(title=f"reads of steps {first}:{stop} ({every} step{'s' * (every > 1)} a row)")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "objects / files" else "right",
                         overflow="fold")
    total = None
    for row in rows:
        table.add_row(*_cells(row, terminal))
        total = _added(total, row)
    if total is not None:
        table.add_section()
        table.add_row(*_cells(total, terminal), style="bold")
    _print(out, table)
    return total


def _print(out: Console, table: Table) -> None:
    """`table` on `out`: as wide as the terminal, or as wide as it needs elsewhere."""
    if out.is_terminal:
        out.print(table)
        return
    width = out.width
    out.width = max(width, out.measure(table, options=out.options.update(max_width=1 << 16))
                    .maximum)
    try:
        out.print(table)
    finally:
        out.width = width


def _advice(total: plan_reads.Row | None, out: Console) -> None:
    if total is None or not total.predicted or total.cache_limit is None:
        return
    out.print(
        f"ObjectReads: cache_bytes {_size(total.cache_limit)}, readahead_bytes "
        f"{_size(total.readahead_limit)}. ", soft_wrap=True, end="",
    )
    if total.cache_beyond:
        out.print(f"The cache drops spans before an epoch reads them again, and reading no "
                  f"byte twice in an epoch needs cache_bytes > {_size(total.cache_followed)} "
                  "(the most this plan follows: 4x cache_bytes, at least "
                  f"{_size(plan_reads.NEED_BYTES)}): plan again with a larger cache_bytes.",
                  soft_wrap=True)
    elif total.reread_bytes or total.cache_bytes > total.cache_limit:
        out.print(f"The cache drops spans before an epoch reads them again: cache_bytes >= "
                  f"{_size(total.cache_bytes)} reads no byte twice in an epoch.", soft_wrap=True)
    else:
        out.print("No byte is read twice in an epoch.", soft_wrap=True)
    if total.readahead_limit is not None and total.readahead_bytes > total.readahead_limit:
        out.print(f"A step needs up to {_size(total.readahead_bytes)} of GETs: with "
                  "readahead_bytes below that, read-ahead cannot start a whole step early.",
                  soft_wrap=True)


def _score_table(
    scores: dict[str, shuffle_score.ShuffleScore], plan: plan_lib.Plan,
    compared: tfdata_order.TFDataShuffle, out: Console,
) -> None:
    ours, theirs = scores["ours"], scores["tf"]
    table = Table(title=f"shuffle quality over {ours.positions:,} positions (1 = a uniformly "
                        "random order, 0 = storage order)")
    for column in ("order", "moved", "batches a run spans", "mixed", "score"):
        table.add_column(column, justify="left" if column == "order" else "right",
                         overflow="fold")
    for name, score in ((plan.pipeline.index_stage.describe(), ours),
                        (compared.describe(), theirs)):
        table.add_row(name, f"{score.moved:.2f}", f"{score.spread:.1f}", f"{score.mixed:.2f}",
                      f"{score.score:.2f}")
    table.add_row("ideal (uniformly random)", "1.00", f"{ours.ideal_spread:.1f}", "1.00", "1.00")
    _print(out, table)
    out.print(
        "moved: how far records move from their storage order; mixed: how many batches a "
        "run of batch_size neighbouring records spans; score: the smaller of the two.",
        soft_wrap=True,
    )
