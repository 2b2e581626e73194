"""What a storage server's answer must be, and the errors that name what it was instead.

Every request to object storage (a listing, a look-up, a ranged GET; every protocol)
goes through an aiohttp session that carries `guard`, or (an S3 GET) through urllib3
with redirects followed by `resumeloader.sources.storage.direct`: a redirect to another
origin (scheme, host or port) is never followed — `RedirectError` names the URL and
the ``Location`` before any request leaves for the other origin. A redirect on the same
origin is followed, and the answer it leads to is checked like any other: a GET's
answer must be the version the object was pinned to (`resumeloader.sources.storage.protocols`).

A ranged GET answered 200 with the whole object is a server that ignores ``Range``:
`RangeIgnoredError`, never retried (another try gets the same answer). A 401 or 403 is
`AccessDeniedError`, a `PermissionError` naming the object and the status. None of
these is worth another try (`resumeloader.sources.storage.retry`).
"""

from __future__ import annotations

import errno
import threading
from typing import Any

__all__ = [
    "AccessDeniedError", "RangeIgnoredError", "RedirectError", "Refusal", "denied", "guard",
    "refused_redirect", "shown",
]


class Refusal(OSError):
    """An answer of object storage that no retry changes, naming what was asked.

    Attributes:
        url: the object or listing asked for.
    """

    url: str


class RedirectError(Refusal, ConnectionError):
    """A storage server redirected a request to another origin; it was not followed
    (the bytes there could be anything, and pass a version check by echoing it).

    Attributes:
        url: the URL asked for.
        location: where the server redirected it.
    """

    def __init__(self, msg: str, *, url: str, location: str) -> None:
        super().__init__(errno.ECONNREFUSED, msg)
        self.url, self.location = url, location


class RangeIgnoredError(Refusal):
    """A server answered a ranged GET with the whole object: it ignores ``Range``.

    Attributes:
        url: the object.
    """

    def __init__(self, msg: str, *, url: str) -> None:
        super().__init__(errno.EIO, msg)
        self.url = url


class AccessDeniedError(Refusal, PermissionError):
    """A storage server refused a request (401 or 403): credentials missing, wrong or
    expired (e.g. a signed URL past its expiry).

    Attributes:
        url: the object or listing asked for.
        status: the HTTP status.
    """

    def __init__(self, msg: str, *, url: str, status: int) -> None:
        super().__init__(errno.EACCES, msg)
        self.url, self.status = url, status


def shown(url: Any) -> str:
    """`url` without its query (a signed URL's signature is not shown)."""
    return str(url).split("?", 1)[0]


def denied(url: str, status: int, what: str = "reading") -> AccessDeniedError:
    """The `AccessDeniedError` of a 401/403 answer to `what` of `url`."""
    why = "no or wrong credentials" if status == 401 else "credentials without access"
    msg = (
        f"The server refused {what} {shown(url)}: HTTP {status} ({why}; an expired signed "
        "URL answers so too). Check the credentials (the environment, or Storage.options) "
        "and the object's permissions."
    )
    return AccessDeniedError(msg, url=shown(url), status=status)


def refused_redirect(method: str, url: Any, status: int, location: str) -> RedirectError:
    """The `RedirectError` of a `method` of `url` answered `status` with a redirect to
    `location`, another origin (not followed)."""
    msg = (
        f"{method} {shown(url)} was answered {status} with a "
        f"redirect to another origin, {shown(location)}: not followed (the bytes there are "
        "not the object's, and could pass a version check). Point the source at the "
        "object's real location, or fix the server or proxy that redirects."
    )
    return RedirectError(msg, url=shown(url), location=shown(location))


async def _on_redirect(session: Any, context: Any, params: Any) -> None:
    """Refuses a redirect to another origin before it is followed."""
    import yarl

    headers = params.response.headers
    location = headers.get("Location") or headers.get("URI")
    if location is None:
        return
    try:
        target = params.url.join(yarl.URL(location))
        same = target.origin() == params.url.origin()
    except ValueError:
        same = False
    if same:
        return
    params.response.close()
    raise refused_redirect(params.method, params.url, params.response.status, location)


_lock = threading.Lock()
_guard: list[Any] = []


def guard() -> Any:
    """The aiohttp ``TraceConfig`` that refuses redirects to another origin (one per
    process; aiohttp is imported here, when an object is first reached)."""
    with _lock:
        if not _guard:
            import aiohttp

            config = aiohttp.TraceConfig()
            config.on_request_redirect.append(_on_redirect)
            config.freeze()
            _guard.append(config)
        return _guard[0]
