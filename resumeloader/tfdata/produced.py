"""The produced-batch paths: batches made by the worker backend, handed over by ``from_generator``.

The engine's backend (the calling thread, threads, processes, a Dask cluster) makes
each batch in Python — read, record stages, batch stage, batch map stages — and the
generator hands it to tf.data, where the `Finisher` builds ragged and string leaves
and runs the tensor stages. Two paths, by how the source is read: ``read_batch``
(a source with batched reads and no record stage: one call per batch, or one
``read_packed`` call for a source of strings that reads a batch as one packed column,
e.g. TFRecord runs) and
``records`` (each record read and run through the record stages; the path every
pipeline can take).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import delivery

__all__ = ["ProducedPath", "ReadBatchPath", "RecordsPath"]


class ProducedPath(delivery.DeliveryPath):
    """Batches produced by the engine in Python, through ``from_generator``."""

    #: How the source is read, as ``describe()`` shows it.
    access: str

    def handover(
        self, begin: Callable[[], tuple[int, Any]], watch: delivery.Watch | None
    ) -> tf.data.Dataset:
        def make() -> Any:
            position, layout = begin()
            made = self.engine.batches(position, layout=layout, watch=watch)
            return delivery.without_ends(made)

        return self.generated(make, self.batch_dim)

    def source_access(self) -> str:
        """How the source is read, as ``describe()`` shows it."""
        return self.access

    def source_row(self) -> delivery.Row:
        pipeline = self.engine.plan.pipeline
        record = self.engine.producer.spec.describe()
        element = record if not pipeline.record_stages else "record"
        access = self.source_access()
        return ("source", f"{pipeline.source.description}: {access}", element, "re-read")

    def handover_rows(self) -> list[delivery.Row]:
        batch = self.batch_text()
        return [
            ("workers", self.engine.backend.describe(), batch, "recomputed"),
            ("from_generator", f"{self.name} path: Dataset.from_generator", batch, "recomputed"),
        ]


class ReadBatchPath(ProducedPath):
    """A source with batched reads and no record stage: one ``read_batch`` per batch."""

    name = "read_batch"
    access = "read_batch(indices)"
    #: A source read as one packed column per batch (TFRecord: runs of neighbouring
    #: records, one read each).
    packed = "read_packed(indices): records read in runs"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        return engine.producer.reads_batches

    def source_access(self) -> str:
        return self.packed if self.engine.producer.reads_packed else self.access


class RecordsPath(ProducedPath):
    """Each record read and run through the record stages: every pipeline can take it."""

    name = "records"
    access = "source[index]"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        return True
