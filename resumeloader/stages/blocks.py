"""`BlockStage`: the block order as a pipeline's index stage (``Pipeline.shuffle(block=...)``).

A global shuffle reads records from all over the data, so storage read by ranges
(object storage: one GET per range) serves about one record per GET. The block order
(`resumeloader.core.blocks.BlockOrder`) cuts the records into *chunks* of consecutive
records, permutes the chunks every epoch and the records within each *window* of
`window_chunks` chunks: every window of positions reads exactly its chunks, so each
chunk is one ranged GET into the process's cache, and the chunks of the next windows
can be fetched while the current one trains.

The chunk is asked for in bytes (``block="4MiB"``, about 1-8 MB suits object
storage) and resolved into a number of records from the source's mean record size
(`resolve_chunk`); where the files hold equal record counts the chunk is made to
line up with them (a divisor of a file's records, or whole files) if that keeps it
within a factor of two of the target. The resolved ``chunk_records`` and
``window_chunks`` are the stage's order fields (the byte target is not: the same
records per chunk is the same order).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import numpy as np

from resumeloader.core import blocks, validate
from resumeloader.stages import base, fields

__all__ = ["BlockStage", "build", "parse_bytes", "resolve_chunk"]

_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
}


def parse_bytes(value: validate.Int | str, name: str = "block") -> int:
    """A positive number of bytes: an int, or a string such as ``"4MiB"`` or ``"8 MB"``."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            msg = (
                f"`{name}` must be a number of bytes: an int or a string such as '4MiB' or "
                f"'8MB' (units B, KB, MB, GB, KiB, MiB, GiB). Received: {name}={value!r}."
            )
            raise ValueError(msg)
        value = int(float(match.group(1)) * _UNITS[unit])
    return validate.integer(name, value, low=1, high=validate.MAX_COUNT)


def resolve_chunk(target_bytes: int, mean_bytes: float, per_file: list[int] | None) -> int:
    """Records per chunk: about `target_bytes` of records of `mean_bytes`, lined up with
    the files when they hold equal counts (`per_file`, the last one may be shorter)."""
    chunk = max(1, round(target_bytes / max(mean_bytes, 1e-9)))
    if not per_file or len(set(per_file[:-1] or per_file)) != 1:
        return chunk
    records = per_file[0]
    if chunk >= records:
        aligned = max(1, round(chunk / records)) * records
    else:
        parts = max(1, round(records / chunk))
        for extra in range(64):  # the nearest divisor at or above, if close enough
            if records % (parts + extra) == 0:
                parts += extra
                break
        else:
            return chunk
        aligned = records // parts
    return aligned if chunk / 2 <= aligned <= chunk * 2 else chunk


@dataclasses.dataclass(frozen=True)
class BlockStage(base.IndexStage):
    """Record `BlockOrder` ``(num_records, chunk_records, window_chunks, seed)`` at each offset.

    Each epoch is a permutation of ``[0, num_records)``, computed offset by offset in
    O(1); the positions of window ``w`` hold exactly the records of its chunks. The
    seed is the pipeline's (`indices` receives it). The resolved `chunk_records` and
    `window_chunks` are the order fields (with the algorithm's version).
    """

    name = "blocks"
    algorithm = blocks.ALGORITHM

    num_records: int = dataclasses.field(metadata=fields.meta(check=fields.count))
    #: Consecutive records per chunk.
    chunk_records: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )
    #: Chunks per window (records move within a window).
    window_chunks: int = dataclasses.field(
        kw_only=True, metadata=fields.meta(check=fields.count, order=True)
    )

    def order(self, seed: int) -> blocks.BlockOrder:
        """The block order for the pipeline's `seed`."""
        return _order(self.num_records, self.chunk_records, self.window_chunks, seed)

    def indices(self, epoch: int, offsets: np.ndarray, *, seed: int) -> np.ndarray:
        return self.order(seed).indices(epoch, offsets)

    def describe(self) -> str:
        return (
            f"BlockOrder: chunks of {self.chunk_records} records shuffled, records shuffled "
            f"within windows of {self.window_chunks} chunks"
        )


@functools.lru_cache(maxsize=32)
def _order(num_records: int, chunk_records: int, window_chunks: int, seed: int
           ) -> blocks.BlockOrder:
    return blocks.BlockOrder(
        num_records, chunk_records=chunk_records, window_chunks=window_chunks, seed=seed
    )


def build(
    source: Any,
    *,
    enabled: bool,
    block: validate.Int | str | None,
    window_chunks: validate.Int,
    chunk_records: validate.Int | None,
) -> BlockStage:
    """The `BlockStage` of ``Pipeline.shuffle(block=..., ...)`` for `source`: the
    chunk resolved from `block` bytes (or `chunk_records`), the arguments checked."""
    if not enabled:
        msg = (
            "`block` and `chunk_records` shape a shuffle: they need enabled=True. "
            f"Received: enabled=False, block={block!r}, chunk_records={chunk_records!r}."
        )
        raise ValueError(msg)
    if block is not None and chunk_records is not None:
        msg = (
            "Pass `block` (bytes) or `chunk_records` (records), not both. Received: "
            f"block={block!r}, chunk_records={chunk_records!r}."
        )
        raise ValueError(msg)
    if chunk_records is None:
        assert block is not None
        target = parse_bytes(block)
        mean = source.mean_record_bytes()
        if mean is None:
            msg = (
                f"`block={block!r}` needs the source's record sizes, which "
                f"{source.description} does not know. Pass `chunk_records` (records per "
                "chunk) instead."
            )
            raise ValueError(msg)
        chunk = resolve_chunk(target, mean, source.records_per_file())
    else:
        chunk = validate.integer("chunk_records", chunk_records, low=1, high=validate.MAX_COUNT)
    # At most the source's records (one chunk); the stage checks the rest, as it would
    # for `Pipeline.apply(BlockStage(...))`.
    return BlockStage(
        len(source), chunk_records=min(chunk, len(source)),
        window_chunks=window_chunks,  # type: ignore[arg-type]  # checked by the stage
    )
