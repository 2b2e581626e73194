"""Objects in storage: what one is (`Object`: URL, size, version), finding them, listing them.

An `Object` is an object in ``s3://`` (and ``s3a://``), ``gs://`` / ``gcs://``,
``http(s)://`` or ``memory://`` storage, with its size and *version* as seen when
the source was built (the S3 or HTTP ``ETag``, the GCS ``generation``): every read
of it is pinned to that version (`resumeloader.sources.storage.fetch`), so an
object that changed is refused, never read as other bytes. `stat` looks one up,
`expand` lists a glob's matches (their sizes and versions come from the listing: no
request per object). The filesystems are `resumeloader.sources.storage.filesystems`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import re
from collections.abc import Mapping
from typing import Any

from resumeloader.sources.storage import answers, filesystems, retry

__all__ = [
    "Object",
    "Options",
    "companions",
    "display_url",
    "expand",
    "info",
    "is_url",
    "listed",
    "local_path",
    "protocol",
    "stat",
]

#: A filesystem's keyword arguments as sorted pairs (`Storage.options`).
Options = tuple[tuple[str, Any], ...]

#: URL scheme -> the fsspec protocol that reads it.
_PROTOCOLS = {
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http",
    "memory": "memory",
}


@dataclasses.dataclass(frozen=True)
class Object:
    """An object in storage as it was when the source was built.

    Attributes:
        url: its URL, as given (or as the listing of a pattern names it).
        size: its length in bytes.
        version: what pins its content: the ``ETag`` (S3, HTTP), the ``generation``
            (GCS), or ``""`` where the store keeps none (``memory://``, an HTTP server
            without ETags): then only the size is checked.
        options: the keyword arguments its filesystem is built with (`Storage.options`).
    """

    url: str
    size: int
    version: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def protocol(self) -> str:
        return protocol(self.url) or "file"

    @property
    def name(self) -> str:
        """The object's base name (what identifies it in the order fields)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]

    def __str__(self) -> str:
        return display_url(self.url)


def protocol(path: Any) -> str | None:
    """The fsspec protocol of `path` (``"s3"``, ``"gcs"``, ``"http"``, ``"memory"``), or
    None for a local path (``file://`` included)."""
    if not isinstance(path, str) or "://" not in path:
        return None
    scheme = path.split("://", 1)[0].lower()
    return _PROTOCOLS.get(scheme)


def is_url(path: Any) -> bool:
    """Whether `path` names an object in storage (not a local file)."""
    return protocol(path) is not None


def local_path(path: str) -> str:
    """`path` with a ``file://`` prefix removed."""
    return path[len("file://") :] if path.lower().startswith("file://") else path


def display_url(url: str) -> str:
    """`url` without a query string (which may hold a signature) for messages."""
    return url.split("?", 1)[0]


def version_of(proto: str, info: Mapping[str, Any]) -> str:
    """The version in a filesystem's `info` of an object (see `Object.version`)."""
    if proto == "gcs":
        return str(info.get("generation") or "")
    for key in ("ETag", "etag"):
        if info.get(key):
            return str(info[key])
    if proto == "memory" and info.get("created") is not None:
        return str(info["created"])
    return ""


def strip(proto: str, url: str) -> str:
    """`url` as its filesystem names it (no scheme, except for HTTP)."""
    return url if proto in ("http", "memory") else url.split("://", 1)[1]


def _with_scheme(url: str, found: str) -> str:
    scheme = url.split("://", 1)[0]
    return found if "://" in found else f"{scheme}://{found}"


def _run(fs: Any, make: Any) -> Any:
    """`make()` (a coroutine) run to its end on `fs`'s event loop, from this thread."""
    import fsspec.asyn

    return fsspec.asyn.sync(fs.loop, make)


async def info(url: str, options: Options = ()) -> dict[str, Any]:
    """The store's facts about the object at `url` now (its ``size``, its version, its
    ``type``), read afresh (no listing cache).

    Raises:
        FileNotFoundError: there is no such object.
        AccessDeniedError: the store refused the look-up (401/403).
        RedirectError: the store redirected it to another origin.
    """
    proto = protocol(url)
    assert proto is not None, url
    fs = filesystems.filesystem(proto, options)
    if proto == "memory":
        return dict(fs.info(url))
    if proto == "http":
        return await _http_info(fs, url)
    path = strip(proto, url)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(path)
    return dict(await fs._info(path))


async def _http_info(fs: Any, url: str) -> dict[str, Any]:
    """A HEAD of `url` (a ranged GET of its first byte when HEAD tells no size)."""
    kwargs = dict(fs.kwargs)
    headers = {**kwargs.pop("headers", {}), "Accept-Encoding": "identity"}
    session = await fs.set_session()
    for method, extra in (("HEAD", {}), ("GET", {"Range": "bytes=0-0"})):
        async with session.request(
            method, url, headers={**headers, **extra}, allow_redirects=True, **kwargs
        ) as answer:
            if answer.status in (404, 410):
                raise FileNotFoundError(f"Object {display_url(url)} does not exist.")
            if answer.status in (401, 403):
                raise answers.denied(url, answer.status, "looking up")
            if answer.status in (405, 501) and method == "HEAD":
                continue  # HEAD not served: ask for one byte instead
            answer.raise_for_status()
            total = answer.headers.get("Content-Range", "").rpartition("/")[2]
            size = total if method == "GET" else answer.headers.get("Content-Length")
            if size is None or not str(size).isdigit():
                continue
            return {"size": int(size), "ETag": answer.headers.get("ETag"), "type": "file"}
    msg = f"The server of {display_url(url)} tells no size for it (no Content-Length)."
    raise OSError(errno.EIO, msg)


def _refusal(url: str, err: BaseException, what: str) -> BaseException | None:
    """What a failed look-up or listing of `url` is, when it is more than the library's
    error: a redirect to another origin, a refusal (401/403)."""
    redirect = retry.found(err, answers.RedirectError)
    if redirect is not None:
        msg = f"{what.capitalize()} {display_url(url)}: {redirect.strerror}"
        return answers.RedirectError(msg, url=url, location=redirect.location)
    denied = retry.found(err, answers.AccessDeniedError)
    if denied is not None:
        return denied
    if retry.forbidden(err):
        return answers.denied(url, retry.http_status(err) or 403, what)
    return None


def stat(url: str, options: Options = ()) -> Object:
    """The object at `url` as it is now.

    Raises:
        FileNotFoundError: there is no such object (or it is a folder).
        AccessDeniedError: the store refused the look-up (401/403: a PermissionError).
        RedirectError: the store redirected it to another origin.
    """
    proto = protocol(url)
    assert proto is not None, url
    fs = filesystems.filesystem(proto, options)
    try:
        found = retry.retried(
            lambda: fs.info(url) if proto == "memory" else _run(fs, lambda: info(url, options))
        )
    except FileNotFoundError:
        found = None
    except Exception as err:
        better = _refusal(url, err, "looking up")
        if better is None:
            raise
        raise better from err
    if found is None or found.get("type") == "directory":
        msg = f"Object {display_url(url)} does not exist (or is a folder)."
        raise FileNotFoundError(msg)
    return Object(url, int(found["size"]), version_of(proto, found), options)


def _listed(pattern: str, make: Any) -> Any:
    """`make()` (a listing call), its refusals named."""
    try:
        return retry.retried(make)
    except Exception as err:
        better = _refusal(pattern, err, "listing")
        if better is None:
            raise
        raise better from err


def expand(pattern: str, options: Options = ()) -> list[Object]:
    """The objects `pattern` names: one object, or a glob's matches (sorted by URL).

    The listing is read afresh (no listing cache), and the matches' sizes and
    versions come from it (no request per object).

    Raises:
        FileNotFoundError: the object, or every match of the pattern, is missing.
        AccessDeniedError: the store refused the listing or look-up (401/403).
        RedirectError: the store redirected it to another origin.
    """
    return listed(pattern, options)[0]


def listed(
    pattern: str, options: Options = (), suffix: str = ""
) -> tuple[list[Object], dict[str, Object | None]]:
    """`expand`'s objects, and for a glob with a `suffix` the object named ``url +
    suffix`` beside each match (e.g. its sidecar index) or None, by the match's URL,
    from the same listing (a look-up of one object finds none: it is not listed).
    """
    proto = protocol(pattern)
    assert proto is not None, pattern
    fs = filesystems.filesystem(proto, options)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    if proto == "http" or not any(c in pattern.split("://", 1)[1] for c in "*?["):
        return [stat(pattern, options)], {}
    path = strip(proto, pattern)
    found = _listed(pattern, lambda: fs.glob(path + ("*" if suffix else ""), detail=True))
    if suffix:  # one listing for the matches and what sits beside them
        from fsspec.utils import glob_translate

        wanted = re.compile(glob_translate(path))
        entries = {name.rstrip("/"): info for name, info in found.items()}
        found = {name: info for name, info in entries.items() if wanted.match(name)}
    matches = [
        Object(_with_scheme(pattern, name), int(info["size"]), version_of(proto, info), options)
        for name, info in sorted(found.items())
        if info.get("type") != "directory"
    ]
    if not matches:
        msg = f"`paths` pattern {display_url(pattern)!r} matches no object."
        raise FileNotFoundError(msg)
    beside: dict[str, Object | None] = {}
    if suffix:
        for obj in matches:
            entry = entries.get(strip(proto, obj.url) + suffix)
            beside[obj.url] = None if entry is None else Object(
                obj.url + suffix, int(entry["size"]), version_of(proto, entry), options
            )
    return matches, beside


def companions(found: list[Object], suffix: str) -> dict[str, Object]:
    """The objects named ``url + suffix`` beside each of `found` (e.g. sidecar indexes),
    by the URL of the object they accompany: one listing per folder of `found`, never a
    request per object (HTTP has no listing: a look-up per object there).

    Raises:
        AccessDeniedError: the store refused a listing (401/403).
        RedirectError: the store redirected one to another origin.
    """
    out: dict[str, Object] = {}
    folders: dict[tuple[str, str], list[Object]] = {}  # (folder, options' repr): members
    for obj in found:
        folders.setdefault((obj.url.rsplit("/", 1)[0], repr(obj.options)), []).append(obj)
    for (folder, _), members in folders.items():
        options = members[0].options
        proto = protocol(folder)
        assert proto is not None, folder
        if proto == "http":
            for obj in members:
                with contextlib.suppress(FileNotFoundError):
                    out[obj.url] = stat(display_url(obj.url) + suffix, options)
            continue
        fs = filesystems.filesystem(proto, options)
        if hasattr(fs, "invalidate_cache"):
            fs.invalidate_cache(strip(proto, folder))
        path = strip(proto, folder)
        try:
            listed = _listed(folder, lambda f=fs, p=path: f.ls(p, detail=True))
        except FileNotFoundError:
            continue
        here = {
            _with_scheme(folder, entry["name"]): entry
            for entry in listed if entry.get("type") != "directory"
        }
        for obj in members:
            named = display_url(obj.url) + suffix
            entry = here.get(named)
            if entry is not None:
                out[obj.url] = Object(named, int(entry["size"]), version_of(proto, entry), options)
    return out
