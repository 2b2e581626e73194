"""`Observer`: a loader's stage figures as `Stats`, TensorBoard scalars and a log line.

What the engine's board counted (`resumeloader.core.board`: per batch, per place,
worker processes and Dask workers merged) becomes a `Stats` value
(``loader.stats()``); `write_summaries` writes the figures of the interval since its
last call as ``tf.summary`` scalars (the data wait beside the loss in TensorBoard);
`log_every` logs a one-line summary of each interval from a daemon thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import tensorflow as tf

from resumeloader.core import board as board_lib
from resumeloader.core import exiting
from resumeloader.core import stats as stats_lib

__all__ = ["LOGGER", "Observer"]

#: The logger of the periodic line (`Observer.log_every`).
LOGGER = logging.getLogger("resumeloader.stats")
_PREFIX = "resumeloader"


def _tag(name: str) -> str:
    return name.replace("#", "_").replace(" ", "_")


class Observer:
    """The figures of one loader's board (None: ``RESUMELOADER_STATS=0``)."""

    def __init__(self, board: board_lib.Board | None) -> None:
        self._board = board
        self._written: dict[str, Any] | None = None
        self._stop: threading.Event | None = None

    def stats(self) -> stats_lib.Stats:
        """Everything counted since the loader was made."""
        if self._board is None:
            return stats_lib.Stats.off()
        return stats_lib.Stats.of(self._board.snapshot())

    def write_summaries(self, step: Any, writer: Any = None) -> stats_lib.Stats:
        """Writes the interval since the last call as scalars at `step`; returns its `Stats`.

        Scalars (under ``resumeloader/``): ``data_wait_ms`` (per step) and
        ``data_wait_share``, ``records_per_s`` (delivered), and per stage
        ``<stage>/ms_per_batch`` and ``<stage>/allows_records_per_s``; the bottleneck's
        name as text. To `writer`, or the default writer (``writer.as_default()``).
        """
        if tf.inside_function():
            msg = (
                "`loader.write_summaries()` runs eagerly only: it reads the counters in "
                "Python. Call it between steps, outside the tf.function. Received: a call "
                "while tracing a tf.function."
            )
            raise TypeError(msg)
        if self._board is None:
            return stats_lib.Stats.off()
        now = self._board.snapshot()
        interval = stats_lib.Stats.of(board_lib.difference(now, self._written))
        self._written = now
        if writer is not None:
            with writer.as_default():
                _write(interval, step)
            writer.flush()
        else:
            _write(interval, step)
        return interval

    def log_every(self, seconds: float | None, logger: logging.Logger, level: int) -> None:
        """Logs each `seconds` the summary of the interval (from a daemon thread); None stops."""
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0
        ):
            msg = (
                "`every` must be a positive number of seconds, or None to stop. "
                f"Received: every={seconds!r}."
            )
            raise ValueError(msg)
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if seconds is None or self._board is None:
            return
        stop = self._stop = threading.Event()
        board = self._board
        exiting.on_exit(stop.set)

        def run() -> None:
            before = board.snapshot()
            while not stop.wait(seconds):
                now = board.snapshot()
                interval = stats_lib.Stats.of(board_lib.difference(now, before))
                before = now
                logger.log(level, "resumeloader: %s", interval.summary())

        threading.Thread(target=run, name="resumeloader-stats", daemon=True).start()


def _metadata(plugin: str) -> Any:
    """The summary metadata TensorBoard's plugin `plugin` reads (its plugin data version 0,
    serialized empty): what ``tf.summary.scalar`` and ``tf.summary.text`` write, without
    needing the TensorBoard package."""
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = plugin
    return metadata


def _scalar(tag: str, value: float, step: Any) -> None:
    tf.summary.write(tag, tf.constant(value, tf.float32), step=step,
                     metadata=_metadata("scalars"))


def _write(interval: stats_lib.Stats, step: Any) -> None:
    scalar = _scalar
    if interval.steps:
        scalar(f"{_PREFIX}/data_wait_ms", interval.wait_s / interval.steps * 1e3, step=step)
        share = interval.wait_share
        if share is not None:
            scalar(f"{_PREFIX}/data_wait_share", share, step=step)
    if interval.elapsed_s > 0:
        scalar(f"{_PREFIX}/records_per_s", interval.records / interval.elapsed_s, step=step)
    for stage in interval.stages:
        name = f"{_PREFIX}/{_tag(stage.name)}"
        if stage.batches:
            scalar(f"{name}/ms_per_batch", stage.wall_s / stage.batches * 1e3, step=step)
        if stage.allows is not None:
            scalar(f"{name}/allows_records_per_s", stage.allows, step=step)
    if interval.bottleneck is not None:
        tf.summary.write(f"{_PREFIX}/bottleneck", tf.constant(interval.bottleneck),
                         step=step, metadata=_metadata("text"))
