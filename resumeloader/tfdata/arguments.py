"""The loader's options from its arguments: `Shard` and `Workers` values, or the keywords of 0.2.

``ResumableLoader(...)`` keeps the keywords of 0.2 (``shard_index``, ``num_workers``,
...) as its documented short form; ``ResumableLoader.from_pipeline`` takes them with a
`DeprecationWarning` naming the new form. Pure Python (no TensorFlow), like the values.
"""

from __future__ import annotations

import warnings
from typing import Any

from resumeloader.core import shard as shard_lib
from resumeloader.core import validate
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.workers import options as workers_lib

__all__ = ["deprecated", "given", "options"]

# The keywords of 0.2 that `from_pipeline` still takes, and their new form.
_DEPRECATED = {
    "shard_index": "shard=Shard(index, count)",
    "shard_count": "shard=Shard(index, count)",
    "output_signature": (
        "Pipeline(source, seed=..., output_signature=...) or "
        ".map(fn, output_signature=...) (or pipeline.with_output_signature(...))"
    ),
    "num_workers": "workers=Workers(num_workers, kind=..., timeout=...)",
    "worker_type": "workers=Workers(num_workers, kind=..., timeout=...)",
    "worker_timeout": "workers=Workers(num_workers, kind=..., timeout=...)",
}
_DEFAULTS = {
    "shard_index": 0, "shard_count": 1, "num_workers": 0, "worker_type": "thread",
    "worker_timeout": None,
}


def given(legacy: dict[str, Any]) -> dict[str, Any]:
    """The 0.2 keywords among `legacy` that are not their defaults."""

    def default(name: str, value: Any) -> bool:
        want = _DEFAULTS[name]
        return value is want or (type(value) is type(want) and value == want)

    return {k: v for k, v in legacy.items() if not default(k, v)}


def deprecated(pipeline: pipeline_lib.Pipeline, given: dict[str, Any]) -> pipeline_lib.Pipeline:
    """Warns about the 0.2 keywords `given` to `from_pipeline`; the pipeline they describe."""
    unknown = sorted(set(given) - set(_DEPRECATED))
    if unknown:
        msg = f"from_pipeline() got an unexpected keyword argument {unknown[0]!r}"
        raise TypeError(msg)
    forms = dict.fromkeys(_DEPRECATED[name] for name in given)
    msg = (
        f"ResumableLoader.from_pipeline({', '.join(f'{k}=...' for k in given)}) is "
        f"deprecated: use {'; '.join(forms)}."
    )
    warnings.warn(msg, DeprecationWarning, stacklevel=3)
    if "output_signature" in given:
        pipeline = pipeline.with_output_signature(given.pop("output_signature"))
    return pipeline


def options(
    shard: Any, workers: Any, legacy: dict[str, Any]
) -> tuple[shard_lib.Shard, workers_lib.Workers]:
    """The `Shard` and `Workers` of a loader from the values or the 0.2 keywords."""
    kinds = (("shard", shard, shard_lib.Shard), ("workers", workers, workers_lib.Workers))
    for name, value, kind in kinds:
        if value is not None and not isinstance(value, kind):
            msg = (
                f"`{name}` must be a resumeloader.{kind.__name__} or None. "
                f"Received: {name}={value!r:.80} of type {type(value).__name__}."
            )
            raise TypeError(msg)
    for name, value, keys in (
        ("shard", shard, ("shard_index", "shard_count")),
        ("workers", workers, ("num_workers", "worker_type", "worker_timeout")),
    ):
        clash = [k for k in keys if k in legacy]
        if value is not None and clash:
            msg = (
                f"Give `{name}` or {', '.join(f'`{k}`' for k in keys)}, not both. "
                f"Received: {name}={value!r} and {', '.join(f'{k}={legacy[k]!r}' for k in clash)}."
            )
            raise TypeError(msg)
    if shard is None:
        index, count = validate.shard(legacy.get("shard_index", 0), legacy.get("shard_count", 1))
        shard = shard_lib.Shard(index, count)
    if workers is None:
        workers = workers_lib.legacy(
            legacy.get("num_workers", 0), legacy.get("worker_type", "thread"),
            legacy.get("worker_timeout"),
        )
    return shard, workers
