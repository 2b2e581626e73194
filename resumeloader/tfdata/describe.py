"""``ResumableLoader.describe()``: the pipeline rendered as an execution plan with rich.

One row per stage (a batch stage that only stacks records has none), from the
checkpointed position down to what tf.data hands to the training step: what the
stage is, the element it produces, and whether it is checkpointed, derived from the
checkpoint on every (re)start, or recomputed. The order stages come from the `Plan`,
the rest from the `Delivery`. Once batches were made, the measured figures of each
stage follow the table (`resumeloader.core.stats.Stats`), the bottleneck named.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from resumeloader.core import stats as stats_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import delivery as delivery_lib

__all__ = ["describe"]

_WIDTH = 92  # fits a docstring line
_CAPTION = (
    "CHECKPOINTED: saved (with the order fingerprint). derived: a pure function of it. "
    "re-read, recomputed: redone after a restore, so read-ahead is never lost. "
    "constant: the data itself."
)
Row = delivery_lib.Row


def _order_rows(plan: plan_lib.Plan, delivery: delivery_lib.DeliveryPath) -> list[Row]:
    pipeline = plan.pipeline
    record = delivery.engine.producer.spec.describe()
    epochs = "endless" if plan.num_epochs is None else f"{plan.num_epochs} epochs"
    rows: list[Row] = [
        ("position", "int64 tf.Variable, advanced by the consumer", "int64", "CHECKPOINTED"),
        (
            pipeline.index_stage.name,
            f"{pipeline.index_stage.describe()}, seed {pipeline.seed}, {epochs}, "
            f"shard {plan.shard.index}/{plan.shard.count}",
            "record index",
            "derived",
        ),
        delivery.source_row(),
    ]
    for stage in pipeline.record_stages:
        name = "map_fn" if stage.name == "map" else stage.name
        rows.append((name, stage.describe(), record, "derived"))
    batch = pipeline.batch_stage
    if batch is not None and not batch.stacks:  # grouping beyond stacking: worth a row
        what = batch.describe()
        if batch.window is not None:
            what += "; a restore inside a window recomputes that window"
        rows.append((batch.name, what, f"row {delivery.spec.describe()}", "derived"))
    for batch_map in pipeline.batch_map_stages:
        row = f"row {delivery.spec.describe()}"
        rows.append((batch_map.name, batch_map.describe(), row, "derived"))
    return rows


def describe(
    title: str,
    plan: plan_lib.Plan,
    delivery: delivery_lib.DeliveryPath,
    *,
    console: Console | None = None,
    live: stats_lib.Stats | None = None,
) -> str:
    """Renders a loader's stages as a table titled `title`; returns it as plain text.

    The table depends only on the configuration and the position in `title`. Once a
    stage ran, `live` (the loader's `Stats`) follows it: a summary naming the
    bottleneck and the measured figures of each stage. When `console` is given, both
    are also printed to it (the table with its colours and width).

    An array TensorFlow can address in place (64-byte aligned, contiguous, writable,
    native byte order) is gathered in TensorFlow ops (``tf.gather``); any other (e.g. one
    from ``np.load``, 16 bytes off) by NumPy, a chunk of batches at a time: the source,
    order and map rows say which (elided below: a small array's alignment is the
    allocator's luck).

    Examples:
        >>> import numpy as np, resumeloader
        >>> loader = resumeloader.ResumableLoader(np.zeros((10, 3), np.float32),
        ...                                       batch_size=4, seed=0, num_epochs=1)
        >>> print(loader.describe())
        ResumableLoader: epoch 0, step 0, position 0 (10 records, batch 4, 3 batches per epoch)
        ┌──────────┬──────────────────────────────────────────────┬─────────────────┬──────────────┐
        │ stage    │ what                                         │ element         │ state        │
        ├──────────┼──────────────────────────────────────────────┼─────────────────┼──────────────┤
        │ position │ int64 tf.Variable, advanced by the consumer  │ int64           │ CHECKPOINTED │
        │ sampler  │ IndexSampler: shuffled, seed 0, 1 epochs,    │ record index    │ derived      │
        │          │ shard 0/1                                    │                 │              │
        │ source   │ ndarray of arrays, ...
        │ prefetch │ prefetch(AUTOTUNE)                           │ float32[None,3] │ recomputed   │
        └──────────┴──────────────────────────────────────────────┴─────────────────┴──────────────┘
        CHECKPOINTED: saved (with the order fingerprint). derived: a pure function of it. re-read,
        recomputed: redone after a restore, so read-ahead is never lost. constant: the data itself.
    """
    table = Table(
        title=title,
        title_justify="left",
        caption=_CAPTION,
        caption_justify="left",
        box=box.SQUARE,
    )
    table.add_column("stage", no_wrap=True)
    for column in ("what", "element", "state"):
        table.add_column(column, overflow="fold")
    for row in [*_order_rows(plan, delivery), *delivery.describe_rows()]:
        table.add_row(*(Text(cell) for cell in row))  # Text: no markup, `[i]` stays
    buffer = io.StringIO()
    # force_jupyter=False: in a notebook rich would otherwise display the table and
    # leave the buffer (the returned text) empty.
    plain = Console(
        file=buffer, width=_WIDTH, color_system=None, force_terminal=False, force_jupyter=False
    )
    plain.print(table)
    if console is not None:
        console.print(table)
    text = buffer.getvalue()
    if live is not None and live.stages:
        figures = f"Measured since the loader was made: {live}"
        if console is not None:
            console.print(Text(figures))
        text += figures + "\n"
    return text

