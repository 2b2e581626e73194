"""The delivery paths by preference: the one place a loader's path is chosen.

A path is a `resumeloader.tfdata.delivery.DeliveryPath` subclass in a module of its
own; its entry here places it among the others. A loader takes the first path that
accepts its engine (`DeliveryPath.accepts`), so the more specialised (faster) paths
come first and ``records``, which accepts every pipeline, comes last.
"""

from __future__ import annotations

from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import delivery, gather, graph_path, produced, tfrecord_graph

__all__ = ["PATHS", "choose", "path_class"]

PATHS: tuple[type[delivery.DeliveryPath], ...] = (
    graph_path.GraphPath,
    tfrecord_graph.TFRecordGraphPath,
    gather.GatherPath,
    produced.ReadBatchPath,
    produced.RecordsPath,
)


def path_class(engine: engine_lib.Engine) -> type[delivery.DeliveryPath]:
    """The first path of `PATHS` that accepts `engine`."""
    return next(path for path in PATHS if path.accepts(engine))


def choose(engine: engine_lib.Engine, *, prefetch: int | None) -> delivery.DeliveryPath:
    """The delivery path of `engine`'s batches (nothing started).

    Args:
        engine: makes the batches.
        prefetch: batches prepared ahead of the consumer; None or 0 for none.
    """
    return path_class(engine)(engine, prefetch=prefetch)
