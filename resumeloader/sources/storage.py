"""Where file-backed sources' bytes live: local paths, or objects behind a URL.

A *location* is a local path (``file://`` URLs are local paths) or an `Object`: an
object in ``s3://`` (and ``s3a://``), ``gs://`` / ``gcs://``, ``http(s)://`` or
``memory://`` storage, with its size and *version* as seen when the source was built
(the S3 or HTTP ``ETag``, the GCS ``generation``). Local files are read through
`resumeloader.sources.handles`; objects through `resumeloader.sources.fetch`, which
pins every read to the version: an object that changed is refused, never read as
other bytes.

Filesystems are fsspec's (``s3fs``, ``gcsfs``, fsspec's own ``http`` and ``memory``),
one per protocol and options per process, built when first needed (a source pickled
to a worker process builds its own). Credentials and endpoints come from the
standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
... for S3; ``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST`` for GCS)
and from the sources' ``storage_options=``, passed to the filesystem as they are
(e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}`` for s3fs,
``{"token": ..., "project": ...}`` for gcsfs).

Why fsspec (measured on this machine's local servers, 20 ms added per request; see
CHANGELOG 0.3.0): s3fs and obstore both retried an injected 503, reset and truncated
body and returned the right bytes, both refuse a stale ``If-Match``. obstore was
faster per GET with 16 in flight (4.4 against 7.1 ms per GET, 100 ranged GETs of
3 KB), but its GCS store reads through the XML API, which the GCS emulator does not
serve (every GET 404), and it has no ``memory://`` or ``http://`` filesystems. With
the block order a batch costs far less than one GET, so the per-GET overhead is not
what limits throughput; one library for every protocol is. The libraries' own retry
loops are turned off (s3fs ``retries=1``, botocore ``total_max_attempts=1``: its
``max_attempts`` counts retries, and 1 doubled every GET; gcsfs's request called
once), so that retries are ours, bounded in count and time and the same for every
protocol: `resumeloader.sources.fetch` retries GETs, `resumeloader.sources.retry`
listings and stats. One library retry is left: aiohttp (under s3fs and gcsfs) sends
an idempotent request again once when a pooled connection was dropped (a reset).

The packages are optional extras, installed from a checkout as the README does:
``pip install -e ".[s3]"`` (s3fs), ``".[gcs]"`` (gcsfs) or ``".[http]"`` (fsspec with
aiohttp); importing resumeloader imports none of them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Any

from resumeloader.sources import retry

__all__ = [
    "Object",
    "Options",
    "display_url",
    "expand",
    "filesystem",
    "is_url",
    "local_path",
    "protocol",
    "stat",
]

Options = Mapping[str, Any]

#: URL scheme -> the fsspec protocol that reads it.
_PROTOCOLS = {
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http",
    "memory": "memory",
}
_EXTRAS = {"s3": ("s3fs", "s3"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "http")}


@dataclasses.dataclass(frozen=True)
class Object:
    """An object in storage as it was when the source was built.

    Attributes:
        url: its URL, as given (or as the listing of a pattern names it).
        size: its length in bytes.
        version: what pins its content: the ``ETag`` (S3, HTTP), the ``generation``
            (GCS), or ``""`` where the store keeps none (``memory://``, an HTTP server
            without ETags): then only the size is checked.
        options: the ``storage_options`` its filesystem is built with.
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


def _frozen(options: Options | None) -> tuple[tuple[str, Any], ...]:
    if options is None:
        return ()
    if not isinstance(options, Mapping):
        msg = (
            "`storage_options` must be a mapping of the filesystem's keyword arguments. "
            f"Received: storage_options={options!r} of type {type(options).__name__}."
        )
        raise TypeError(msg)
    return tuple(sorted((str(k), v) for k, v in options.items()))


_lock = threading.Lock()
_filesystems: dict[tuple[int, str, str, tuple[tuple[str, str], ...]], Any] = {}
_ENVIRONMENT = ("AWS_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "GCS", "HTTP_PROXY", "HTTPS_PROXY")


def filesystem(proto: str, options: tuple[tuple[str, Any], ...] = ()) -> Any:
    """The process's fsspec filesystem for `proto` and `options` (built once per process).

    Raises:
        ImportError: the protocol's package is not installed (the message names the
            extra that installs it).
    """
    environment = tuple(
        (k, v) for k, v in sorted(os.environ.items()) if k.startswith(_ENVIRONMENT)
    )  # a filesystem reads these when it is built
    key = (os.getpid(), proto, repr(options), environment)
    with _lock:
        found = _filesystems.get(key)
    if found is not None:
        return found
    fs = _build(proto, dict(options))
    with _lock:
        return _filesystems.setdefault(key, fs)


def _build(proto: str, options: dict[str, Any]) -> Any:
    package, extra = _EXTRAS.get(proto, ("fsspec", ""))
    try:
        if proto == "s3":
            import s3fs

            config = {
                "retries": {"total_max_attempts": 1}, "connect_timeout": 10, "read_timeout": 30
            }
            config.update(options.pop("config_kwargs", {}))
            retries = options.pop("retries", 1)  # a class attribute of s3fs, not an argument
            fs = s3fs.S3FileSystem(
                **{"skip_instance_cache": True, "config_kwargs": config, **options}
            )
            fs.retries = retries
            return fs
        if proto == "gcs":
            # The core class: gcsfs's default (ExtendedGcsFileSystem) asks a gRPC API for
            # each bucket's type first, which an emulator does not serve (60 s per bucket).
            import gcsfs.core

            if os.environ.get("STORAGE_EMULATOR_HOST") and "token" not in options:
                options["token"] = "anon"
            return gcsfs.core.GCSFileSystem(**{"skip_instance_cache": True, **options})
        if proto == "http":
            from fsspec.implementations import http

            return http.HTTPFileSystem(**{"skip_instance_cache": True, **options})
        from fsspec.implementations import memory

        return memory.MemoryFileSystem(**options)
    except ImportError as err:
        hint = (
            f'pip install {package} (the `{extra}` extra: pip install -e ".[{extra}]" in a '
            "checkout of resumeloader)" if extra else f"pip install {package}"
        )
        msg = f"Reading {proto}:// objects needs the `{package}` package: {hint}."
        raise ImportError(msg) from err


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


def stat(url: str, options: Options | None = None) -> Object:
    """The object at `url` as it is now.

    Raises:
        FileNotFoundError: there is no such object (or it is a folder).
    """
    proto = protocol(url)
    assert proto is not None, url
    frozen = _frozen(options)
    fs = filesystem(proto, frozen)
    try:
        info = retry.retried(lambda: fs.info(strip(proto, url)))
    except FileNotFoundError:
        info = None
    if info is None or info.get("type") == "directory":
        msg = f"Object {display_url(url)} does not exist (or is a folder)."
        raise FileNotFoundError(msg)
    return Object(url, int(info["size"]), version_of(proto, info), frozen)


def expand(pattern: str, options: Options | None = None) -> list[Object]:
    """The objects `pattern` names: one object, or a glob's matches (sorted by URL).

    The listing is read afresh (no listing cache), and the matches' sizes and
    versions come from it (no request per object).

    Raises:
        FileNotFoundError: the object, or every match of the pattern, is missing.
    """
    proto = protocol(pattern)
    assert proto is not None, pattern
    frozen = _frozen(options)
    fs = filesystem(proto, frozen)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    if proto == "http" or not any(c in pattern.split("://", 1)[1] for c in "*?["):
        return [stat(pattern, options)]
    found = retry.retried(lambda: fs.glob(strip(proto, pattern), detail=True))
    objects = [
        Object(_with_scheme(pattern, name), int(info["size"]), version_of(proto, info), frozen)
        for name, info in sorted(found.items())
        if info.get("type") != "directory"
    ]
    if not objects:
        msg = f"`paths` pattern {display_url(pattern)!r} matches no object."
        raise FileNotFoundError(msg)
    return objects
