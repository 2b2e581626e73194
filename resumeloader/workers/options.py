"""`Workers`: where and how batches are made (an option value); never what they hold."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from resumeloader.core import validate
from resumeloader.workers import backend as backend_lib
from resumeloader.workers import produce, registry

__all__ = ["MAX_WORKERS", "Workers", "legacy"]

MAX_WORKERS = 1024
# The fields every kind takes; a backend names the others it takes (`Backend.option_fields`).
_COMMON = ("num_workers", "kind")


@dataclasses.dataclass(frozen=True)
class Workers:
    """The workers that make a loader's batches: how many, of which kind, how long to wait.

    Batches are handed out strictly in order whatever the workers, so the stream does
    not depend on any field here: a state saved with one `Workers` restores exactly
    with another. Frozen and checked on construction (each kind checks the fields it
    needs, `Backend.check`).

    Args:
        num_workers: workers making batches in parallel; 0 (the default) makes them
            in the thread that iterates the loader.
        kind: ``"inline"`` (the calling thread; the default for 0 workers),
            ``"thread"`` (daemon threads; the default otherwise) or ``"process"``
            (spawned processes that receive the pipeline pickled once and return
            batches through shared memory; for a GIL-bound ``map_fn``). Process workers
            start once and serve every iteration and epoch until the loader's
            ``close`` (or garbage collection, or exit); they never import
            ``__main__`` nor TensorFlow. A dead worker raises `WorkerError`.
            ``"dask"``: batch tasks on a Dask cluster (the ``resumeloader[dask]``
            extra; `client`, `address`, or a local cluster of `num_workers`
            processes), retried there when a worker is lost.
        timeout: seconds to wait for one batch from a worker before raising a
            `WorkerError` naming it (a stalled process worker is stopped and replaced
            by the next iteration; a process's start-up is not counted; on a Dask
            cluster, the whole wait, the result's transfer included, and the error
            says what the scheduler reports); None (the default) waits as long as the
            worker lives (on Dask: until a worker makes and delivers the batch, without
            end if every worker is gone). Needs ``num_workers >= 1`` (or a Dask cluster).
        window: the most batch tasks in flight (being made or waiting to be handed
            out); None: the kind's default (2 per worker for threads and processes,
            2 per thread of the cluster for Dask).
        client: kind ``"dask"``: a ``distributed.Client`` of the cluster that makes the
            batches (the loader neither starts nor closes it).
        address: kind ``"dask"``: the address of a Dask scheduler to connect to (e.g.
            ``"tcp://10.0.0.5:8786"``); the loader's client closes with the loader.
            Without ``client`` and ``address``, ``Workers(n, kind="dask")`` starts a
            local cluster of `n` worker processes that the loader owns and closes.

    Raises:
        TypeError, ValueError: a field is invalid, or does not fit the kind.

    Examples:
        >>> Workers(2, kind="process", timeout=30)
        Workers(num_workers=2, kind='process', timeout=30.0, window=None)
        >>> Workers().kind, Workers(2).kind
        ('inline', 'thread')
    """

    num_workers: int = 0
    kind: str = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
    timeout: float | None = dataclasses.field(default=None, kw_only=True)
    window: int | None = dataclasses.field(default=None, kw_only=True)
    client: Any = dataclasses.field(default=None, kw_only=True, repr=False)
    address: str | None = dataclasses.field(default=None, kw_only=True, repr=False)

    def __repr__(self) -> str:
        # A backend's own fields are shown when set (the repr of the common ones is 0.2's).
        shown = [
            f"{field.name}={getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if field.repr or getattr(self, field.name) is not None
        ]
        return f"Workers({', '.join(shown)})"

    def __post_init__(self) -> None:
        num = validate.integer("num_workers", self.num_workers, low=0, high=MAX_WORKERS)
        kind = self.kind
        if kind is None:
            kind = "thread" if num else "inline"
        object.__setattr__(self, "num_workers", num)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "timeout", _timeout(self.timeout))
        if self.window is not None:
            window = validate.integer("window", self.window, low=1, high=validate.MAX_COUNT)
            object.__setattr__(self, "window", window)
        backend_class = registry.backend_class(kind)
        backend_class.check(self)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _COMMON or field.name in backend_class.option_fields:
                continue
            if value is not field.default and value != field.default:
                takes = ", ".join(backend_class.option_fields) or "none"
                msg = (
                    f"`{field.name}` is not an option of kind={kind!r} (its options: {takes}). "
                    f"Received: {field.name}={value!r:.80}."
                )
                raise ValueError(msg)

    def backend(self, producer: produce.BatchProducer) -> backend_lib.Backend:
        """A new backend of this kind making `producer`'s batches (nothing started).

        Raises:
            TypeError: the backend cannot take the producer's pipeline (e.g. it does
                not pickle, for process workers).
        """
        return registry.backend_class(self.kind)(self, producer)  # type: ignore[call-arg]


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        msg = (
            "`timeout` must be None or a positive, finite number of seconds. "
            f"Received: timeout={value!r}."
        )
        raise (ValueError if ok else TypeError)(msg)
    return float(value)


def legacy(
    num_workers: Any = 0, worker_type: Any = "thread", worker_timeout: Any = None
) -> Workers:
    """The `Workers` of the keywords of 0.2 (``num_workers``, ``worker_type``,
    ``worker_timeout``); ``num_workers=0`` makes batches in the calling thread."""
    if worker_type not in ("thread", "process"):
        msg = (
            "`worker_type` must be 'thread' or 'process'. "
            f"Received: worker_type={worker_type!r}."
        )
        raise ValueError(msg)
    inline = validate.is_integer(num_workers) and num_workers == 0
    return Workers(num_workers, kind="inline" if inline else worker_type, timeout=worker_timeout)

