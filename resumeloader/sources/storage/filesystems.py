"""The fsspec filesystems that reach objects: one per protocol and options per process.

Filesystems are fsspec's (``s3fs``, ``gcsfs``, fsspec's own ``http`` and ``memory``),
built when first needed (a source pickled to a worker process builds its own).
Credentials and endpoints come from the standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ... for S3; ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST`` for GCS) and from `Storage.options`, passed to the
filesystem as they are (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}`` for
s3fs, ``{"token": ..., "project": ...}`` for gcsfs).

Why fsspec (measured on this machine's local servers, 20 ms added per request; see
the design page): s3fs and obstore both retried an injected 503, reset and truncated
body and returned the right bytes, both refuse a stale ``If-Match``. obstore was
faster per GET with 16 in flight (4.4 against 7.1 ms per GET, 100 ranged GETs of
3 KB), but its GCS store reads through the XML API, which the GCS emulator does not
serve (every GET 404), and it has no ``memory://`` or ``http://`` filesystems. With
the block order a batch costs far less than one GET, so the per-GET overhead is not
what limits throughput; one library for every protocol is. The libraries' own retry
loops are turned off (s3fs ``retries=1``, botocore ``total_max_attempts=1``: its
``max_attempts`` counts retries, and 1 doubled every GET; gcsfs's request called
once), so that retries are ours, bounded in count and time and the same for every
protocol: `resumeloader.sources.storage.fetch` retries GETs,
`resumeloader.sources.storage.retry` listings and stats. One library retry is left:
aiohttp (under s3fs and gcsfs) sends an idempotent request again once when a pooled
connection was dropped (a reset).

Every filesystem's HTTP session carries the redirect guard
(`resumeloader.sources.storage.answers.guard`): no request of any protocol follows a
redirect to another origin.

The packages are optional extras, installed from a checkout as the README does:
``pip install -e ".[s3]"`` (s3fs), ``".[gcs]"`` (gcsfs) or ``".[http]"`` (fsspec with
aiohttp); importing resumeloader imports none of them.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from resumeloader.sources.storage import answers

__all__ = ["filesystem"]

_EXTRAS = {"s3": ("s3fs", "s3"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "http")}
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
                "retries": {"total_max_attempts": 1}, "connect_timeout": 10, "read_timeout": 30,
                "http_session_cls": _guarded_s3_session(), **_checksums_when_required(),
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
            options["session_kwargs"] = _guarded(options.get("session_kwargs"))
            return gcsfs.core.GCSFileSystem(**{"skip_instance_cache": True, **options})
        if proto == "http":
            from fsspec.implementations import http

            options["client_kwargs"] = _guarded(options.get("client_kwargs"))
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




def _checksums_when_required() -> dict[str, str]:
    """botocore's flexible checksums only where a call asks for them (botocore >= 1.36;
    older ones have none), which no GET here does: otherwise every body goes through
    botocore's CRC32 (a CPU cost per byte in the event loop's thread), when S3 gives a
    ranged GET of part of an object none anyway. What is read is checked otherwise: its
    length and version here, the transfer by TLS, a TFRecord's records by their CRC32C."""
    try:
        import botocore.config

        botocore.config.Config(response_checksum_validation="when_required")
    except (ImportError, TypeError):
        return {}
    return {"response_checksum_validation": "when_required",
            "request_checksum_calculation": "when_required"}


def _guarded(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """aiohttp ``ClientSession`` keyword arguments with the redirect guard added."""
    kwargs = dict(kwargs or {})
    kwargs["trace_configs"] = [*kwargs.get("trace_configs", []), answers.guard()]
    return kwargs


_S3_SESSION: list[type] = []


def _guarded_s3_session() -> type:
    """aiobotocore's aiohttp session class, its sessions carrying the redirect guard
    (aiobotocore builds its ``ClientSession`` itself: the guard joins it when made)."""
    with _lock:
        if not _S3_SESSION:
            from aiobotocore.httpsession import AIOHTTPSession

            class GuardedSession(AIOHTTPSession):
                async def _get_session(self, proxy_url: Any) -> Any:
                    session = await super()._get_session(proxy_url)
                    config = answers.guard()
                    if config not in session.trace_configs:
                        session.trace_configs.append(config)
                    return session

            _S3_SESSION.append(GuardedSession)
        return _S3_SESSION[0]
