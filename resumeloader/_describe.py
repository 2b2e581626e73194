"""`ResumableLoader.describe()`: the pipeline rendered as an execution plan with rich.

One row per stage, from the checkpointed position down to what tf.data hands to the
training step: what the stage is, the element it produces, and whether it is
checkpointed, derived from the checkpoint on every (re)start, or recomputed.
"""

from __future__ import annotations

import io
from typing import Any

import optree
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["describe"]

_WIDTH = 92  # fits a docstring line
_CAPTION = (
    "CHECKPOINTED: saved (with the order fingerprint). derived: a pure function of it. "
    "re-read, recomputed: redone after a restore, so read-ahead is never lost. "
    "constant: the data itself."
)


def _spec_text(spec: Any) -> str:
    def leaf(s: Any) -> str:
        dims = ",".join("None" if d is None else str(d) for d in s.shape.as_list())
        return f"{s.dtype.name}[{dims}]"

    text = str(optree.tree_map(leaf, spec, none_is_leaf=True))
    return text.replace("'", "")


def _stages(loader: Any) -> list[tuple[str, str, str, str]]:
    adapter = loader._adapter
    sampler = loader.sampler
    producer = loader._producer
    record = producer.spec.describe()
    map_fn = producer.map_fn
    batched = map_fn is None and adapter.read_batch is not None
    epochs = "endless" if sampler.num_epochs is None else f"{sampler.num_epochs} epochs"
    order = "shuffled" if sampler.shuffle else "in order"
    rows = [
        ("position", "int64 tf.Variable, advanced by the consumer", "int64", "CHECKPOINTED"),
        (
            "sampler",
            f"IndexSampler: {order}, seed {sampler.seed}, {epochs}, "
            f"shard {sampler.shard_index}/{sampler.shard_count}",
            "record index",
            "derived",
        ),
    ]
    if loader._gatherer is not None:  # arrays, no map_fn: no Python per record
        rows.append(("source", f"{adapter.description}, as constant tensors", record, "constant"))
    else:
        access = "read_batch(indices)" if batched else "source[index]"
        rows.append(("source", f"{adapter.description}: {access}", record if map_fn is None
                     else "record", "re-read"))
    if map_fn is not None:
        name = getattr(map_fn, "__qualname__", type(map_fn).__name__)
        rows.append(("map_fn", f"{name}(record, rng)", record, "derived"))
    workers = loader.num_workers
    batch = _spec_text(loader.element_spec)
    if loader._gatherer is not None:
        rows.append(("from_generator", "index array of each batch", "int64[None]", "recomputed"))
        rows.append(("map", "tf.gather(source, indices)", batch, "recomputed"))
    else:
        if workers:
            plural = "s" if workers != 1 else ""
            plan = f"{workers} {loader.worker_type} worker{plural}, <= {loader._workers.in_flight}"
            plan += " in flight, in order"
            plan += ", shared memory" if loader.worker_type == "process" else ""
        else:
            plan = "in the generator thread (num_workers=0)"
        rows.append(("workers", plan, batch, "recomputed"))
        rows.append(("from_generator", "Dataset.from_generator", batch, "recomputed"))
    prefetch = loader._prefetch
    if prefetch:
        size = "AUTOTUNE" if prefetch == -1 else str(prefetch)
        rows.append(("prefetch", f"prefetch({size})", batch, "recomputed"))
    return rows


def describe(loader: Any, *, console: Console | None = None) -> str:
    """Renders `loader`'s pipeline as a table of stages; returns it as plain text.

    The text depends only on the loader's configuration and position. When `console`
    is given, the table is also printed to it (with its colours and width).

    Example:
        >>> import numpy as np, resumeloader
        >>> loader = resumeloader.ResumableLoader(np.zeros((10, 3), np.float32),
        ...                                       batch_size=4, seed=0, num_epochs=1)
        >>> print(loader.describe())
        ResumableLoader: epoch 0, step 0, position 0 (10 records, batch 4, 3 batches per epoch)
        ┌────────────────┬────────────────────────────────────────┬─────────────────┬──────────────┐
        │ stage          │ what                                   │ element         │ state        │
        ├────────────────┼────────────────────────────────────────┼─────────────────┼──────────────┤
        │ position       │ int64 tf.Variable, advanced by the     │ int64           │ CHECKPOINTED │
        │                │ consumer                               │                 │              │
        │ sampler        │ IndexSampler: shuffled, seed 0, 1      │ record index    │ derived      │
        │                │ epochs, shard 0/1                      │                 │              │
        │ source         │ ndarray of arrays, as constant tensors │ float32[3]      │ constant     │
        │ from_generator │ index array of each batch              │ int64[None]     │ recomputed   │
        │ map            │ tf.gather(source, indices)             │ float32[None,3] │ recomputed   │
        │ prefetch       │ prefetch(AUTOTUNE)                     │ float32[None,3] │ recomputed   │
        └────────────────┴────────────────────────────────────────┴─────────────────┴──────────────┘
        CHECKPOINTED: saved (with the order fingerprint). derived: a pure function of it. re-read,
        recomputed: redone after a restore, so read-ahead is never lost. constant: the data itself.
    """
    table = Table(
        title=(
            f"ResumableLoader: epoch {loader.epoch}, step {loader.step}, position "
            f"{loader.position} ({loader.num_records} records, batch {loader.batch_size}, "
            f"{loader.batches_per_epoch} batches per epoch)"
        ),
        title_justify="left",
        caption=_CAPTION,
        caption_justify="left",
        box=box.SQUARE,
    )
    table.add_column("stage", no_wrap=True)
    for column in ("what", "element", "state"):
        table.add_column(column, overflow="fold")
    for row in _stages(loader):
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
    return buffer.getvalue()
