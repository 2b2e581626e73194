"""Which failures of storage calls are worth another try, and trying again.

The libraries' own retry loops are turned off (`resumeloader.sources.storage.filesystems`), so
that retries are bounded in count and time and alike for every protocol: ranged GETs
are retried by `resumeloader.sources.storage.fetch` with `ObjectReads`; listings and stats by
`retried` here. `transient` decides: a 5xx, 408 or 429 answer, a reset or refused
connection, a timeout or a short body is; a 4xx, a missing object, a permission, a
redirect to another origin or an ignored ``Range`` is not. `http_status` finds the
status in the errors of s3fs, gcsfs and aiohttp.
"""

from __future__ import annotations

import random
import time
from typing import Any, TypeVar

from resumeloader.sources.storage import answers

E = TypeVar("E", bound=BaseException)

__all__ = ["ATTEMPTS", "forbidden", "found", "http_status", "retried", "transient"]


def _causes(err: BaseException | None) -> list[BaseException]:
    """`err` and what it was raised from (botocore's wrapping errors keep theirs in
    ``kwargs["error"]``), at most 8 deep."""
    chain: list[BaseException] = []
    while err is not None and len(chain) < 8 and err not in chain:
        chain.append(err)
        wrapped = getattr(err, "kwargs", None)
        inner = wrapped.get("error") if isinstance(wrapped, dict) else None
        err = inner if isinstance(inner, BaseException) else (err.__cause__ or err.__context__)
    return chain


def found(err: BaseException, kind: type[E]) -> E | None:
    """The first error of `kind` in `err`'s chain, if any."""
    return next((e for e in _causes(err) if isinstance(e, kind)), None)


def forbidden(err: BaseException) -> bool:
    """Whether `err` is a refusal (401/403): a PermissionError, or gcsfs's "Forbidden"."""
    return any(
        isinstance(e, PermissionError) or str(e).startswith("Forbidden") for e in _causes(err)
    )


def http_status(err: BaseException | None) -> int | None:
    """The HTTP status an error of s3fs, gcsfs or aiohttp carries, if any."""
    seen = 0
    while err is not None and seen < 8:
        response = getattr(err, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        # gcsfs's HttpError (.code) and aiohttp's ClientResponseError (.status); not the
        # codes of aiohttp's parse errors (a truncated body's ContentLengthError is "400")
        value = None
        if type(err).__module__.startswith("gcsfs"):
            value = getattr(err, "code", None)
        elif hasattr(err, "request_info") and hasattr(err, "history"):
            value = getattr(err, "status", None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def transient(err: BaseException) -> bool:
    """Whether a failed storage call is worth another try: a 5xx, 408 or 429 answer, a
    reset or refused connection, a timeout, a short body; not a 4xx, a missing object
    (fsspec's HTTP filesystem says FileNotFoundError for any failed request: one caused
    by a connection error is transient), a permission, a redirect to another origin or
    an ignored ``Range``."""
    if isinstance(err, (PermissionError, ImportError, NotImplementedError, TypeError)):
        return False
    final = (answers.RedirectError, answers.RangeIgnoredError)
    if forbidden(err) or any(found(err, kind) for kind in final):
        return False
    code = http_status(err)
    if code is not None:
        return code >= 500 or code in (408, 429)
    if isinstance(err, FileNotFoundError):
        cause = err.__cause__
        return cause is not None and not isinstance(cause, FileNotFoundError)
    return True


ATTEMPTS = 5


def retried(call: Any) -> Any:
    """`call()`, tried again after a jittered backoff (0.1 s doubled, at most 2 s) while it
    fails transiently, at most `ATTEMPTS` times (listings and stats: the libraries' own
    retries are off)."""
    wait = 0.1
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except Exception as err:
            if attempt == ATTEMPTS or not transient(err):
                raise
        time.sleep(wait * (0.5 + random.random() / 2))
        wait = min(2.0, wait * 2)
    raise AssertionError("unreachable")
