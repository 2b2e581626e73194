"""`Workers`: where and how batches are made (an option value); never what they hold."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from resumeloader.core import validate
from resumeloader.workers import backend as backend_lib
from resumeloader.workers import produce, registry

__all__ = ["MAX_WORKERS", "Workers"]

MAX_WORKERS = 1024
# The fields every kind takes; a backend names the others it takes (`Backend.option_fields`).
_COMMON = ("num_workers", "kind", "options")


# Keywords removed from `Workers` and their new spelling.
_REMOVED = {
    "client": "Workers(kind='dask', options=DaskOptions(client=...))",
    "address": "Workers(kind='dask', options=DaskOptions(address=...))",
}


@dataclasses.dataclass(frozen=True, init=False)
class Workers:
    """The workers that make a loader's batches: how many, of which kind, how long to wait.

    Batches are handed out strictly in order whatever the workers, so the stream does
    not depend on any field here: a state saved with one `Workers` restores exactly
    with another. Frozen and checked on construction (each kind checks the fields it
    needs, `Backend.check`).

    Args:
        num_workers: workers making batches in parallel; 0 (the default) makes them
            in the thread that iterates the loader; ``"auto"`` (the same as
            ``kind="auto"``) lets the loader choose the kind and count from measured
            batches, and change them as it runs (`AutoBackend`), the stream unchanged.
        kind: ``"inline"`` (the calling thread; the default for 0 workers),
            ``"thread"`` (daemon threads; the default otherwise) or ``"process"``
            (spawned processes that receive the pipeline pickled once and return
            batches through shared memory; for a GIL-bound ``map_fn``). Process workers
            start once and serve every iteration and epoch until the loader's
            ``close`` (or garbage collection, or exit); they never import
            ``__main__`` nor TensorFlow. A dead worker raises `WorkerError`.
            ``"dask"``: batch tasks on a Dask cluster (the ``dask``
            extra; a cluster given by ``options=DaskOptions(client=...)`` or
            ``DaskOptions(address=...)``, or a local cluster of `num_workers`
            processes), retried there when a worker is lost.
            ``"auto"``: none, threads or processes, chosen and re-chosen from what
            the batches measure, under a CPU and a RAM budget (``options=Tuning(...)``);
            every decision is logged and in ``loader.stats().decisions``.
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
        options: the kind's own options value (``"dask"``: a `DaskOptions`); None: its
            defaults. A kind without options refuses one.

    Raises:
        TypeError, ValueError: a field is invalid, or does not fit the kind.

    Examples:
        >>> Workers(2, kind="process", timeout=30)
        Workers(num_workers=2, kind='process', timeout=30.0, window=None)
        >>> Workers().kind, Workers(2).kind, Workers("auto").kind
        ('inline', 'thread', 'auto')
    """

    num_workers: int = 0
    kind: str = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
    timeout: float | None = dataclasses.field(default=None, kw_only=True)
    window: int | None = dataclasses.field(default=None, kw_only=True)
    options: Any = dataclasses.field(default=None, kw_only=True)

    def __init__(
        self,
        num_workers: int = 0,
        *,
        kind: str | None = None,
        timeout: float | None = None,
        window: int | None = None,
        options: Any = None,
        **removed: Any,
    ) -> None:
        for name, value in removed.items():
            if name not in _REMOVED:
                msg = f"Workers() got an unexpected keyword argument {name!r}"
                raise TypeError(msg)
            msg = (
                f"`Workers({name}=...)` was removed in 0.4: a backend's own options are one "
                f"value, `options=`. Received: {name}={value!r:.80}. Expected: "
                f"{_REMOVED[name]}."
            )
            raise TypeError(msg)
        if isinstance(num_workers, str):
            if num_workers != "auto" or kind not in (None, "auto"):
                expected = "a non-negative integer or 'auto'"
                if num_workers == "auto":
                    expected = f"a number with kind={kind!r}, or 'auto' without a kind"
                msg = (
                    f"`num_workers` must be {expected}. Received: "
                    f"num_workers={num_workers!r:.80}."
                )
                raise ValueError(msg)
            num_workers, kind = 0, "auto"
        fields = {"num_workers": num_workers, "kind": kind, "timeout": timeout,
                  "window": window, "options": options}
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __repr__(self) -> str:
        # The options are shown when given (the repr of the other fields is 0.2's).
        shown = [
            f"{field.name}={getattr(self, field.name)!r}"
            for field in dataclasses.fields(self)
            if field.name != "options" or self.options != _default_options(self.kind)
        ]
        if self.kind == "auto":  # no count: it is chosen
            shown = ["'auto'", *(s for s in shown[2:] if not s.endswith("=None"))]
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
        object.__setattr__(self, "options", _options(kind, backend_class, self.options))
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


def _default_options(kind: str) -> Any:
    wanted = registry.backend_class(kind).options_type
    return None if wanted is None else wanted()


def _options(kind: str, backend_class: Any, value: Any) -> Any:
    """The options value of a `Workers` of `kind`: `value`, or the kind's default."""
    wanted = backend_class.options_type
    if value is None:
        return None if wanted is None else wanted()
    if wanted is None or not isinstance(value, wanted):
        expected = "None (it has no options)" if wanted is None else f"a {wanted.__name__} or None"
        msg = (
            f"`options` of kind={kind!r} must be {expected}. Received: options={value!r:.80} "
            f"of type {type(value).__name__}."
        )
        raise TypeError(msg)
    return value


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
