"""S3 GETs whose bodies go straight into place: presigned, sent by urllib3 in reader threads.

s3fs receives a body on fsspec's event loop through aiohttp: each socket read becomes
a new ``bytes`` of up to 256 KiB (under TensorFlow's malloc patch, a fresh ``mmap``
whose pages fault in), is queued, and is copied once more into the buffer it was
meant for. Measured against the same 4.7 MB ranged GETs of a local S3 server, in a
process where TensorFlow had switched malloc's regime: 4.6 us of CPU per 3 KB of body
that way, 1.3 us this way.

This way: the event loop only signs (a presigned URL of the object, from the s3fs
client's own credentials and endpoint: ``Range`` and ``If-Match`` ride along as
headers), and a reader thread sends the GET with urllib3 and receives the body by
``readinto`` of the response, each socket read landing in the recycled buffer
(`resumeloader.core.buffers`) or the part of one it was given: no chunk objects, no
second copy, no page faults. What the answer must be is unchanged
(`resumeloader.sources.storage.protocols` checks status, version and length; its
caller retries): a redirect on the same origin is followed (at most
`MAX_REDIRECTS`), to another origin never (`answers.RedirectError`, before anything is
sent there); an error status is botocore's ``ClientError`` with S3's code, as s3fs's
would be. A reader receives `PIECE` bytes at a time and stops at its deadline (the socket's
timeout bounds each wait) or at the next piece once its GET is cancelled, so a GET
given up soon writes into memory no more.

`usable` and `certificates` say when a filesystem's GETs take this way: an S3
filesystem with no HTTP proxy (from its options or the environment), no
customer-provided encryption keys, no requester-pays, and certificates checked (against
the CA bundle botocore resolved for its client). Others keep s3fs's own GET.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

import numpy as np

from resumeloader.core import buffers
from resumeloader.sources.storage import answers

__all__ = ["MAX_REDIRECTS", "PIECE", "Cancelled", "certificates", "get", "presigned", "stats",
           "usable"]

#: Redirects on the same origin followed per GET (aiohttp's default).
MAX_REDIRECTS = 10
#: Reader threads at most, per process.
MAX_READERS = 64
#: Bytes received per read call at most: between two, a reader looks whether its GET
#: was given up or is past its deadline (one call waits until its bytes all came).
PIECE = 256 << 10
#: Bytes of an error answer's body read, to name its code.
_ERROR_BYTES = 64 << 10
_PROXIES = ("http_proxy", "https_proxy", "all_proxy")


class Cancelled(Exception):
    """A GET given up by its caller while its body was coming: not read further."""


def usable(fs: Any) -> bool:
    """Whether `fs` (an s3fs filesystem) can GET by presigned URL through urllib3, as far
    as its options and the environment say (`certificates` says the rest)."""
    if any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXIES):
        return False
    options = getattr(fs, "storage_options", {}) or {}
    client = options.get("client_kwargs") or {}
    config = options.get("config_kwargs") or {}
    if config.get("proxies") or client.get("verify") is False or options.get("requester_pays"):
        return False
    return not any("sse_customer" in str(key).lower() for key in
                   (*options, *(options.get("s3_additional_kwargs") or {})))


def certificates(fs: Any) -> str | None:
    """The CA bundle the s3fs client of `fs` checks certificates with (what botocore
    resolved: its ``verify`` option, ``AWS_CA_BUNDLE``, the profile's ``ca_bundle``, or
    its default bundle); None when it checks none or it cannot be told (then s3fs's own
    GET is used). Call after ``await fs.set_session()``."""
    from botocore.httpsession import get_cert_path

    session = getattr(getattr(fs.s3, "_endpoint", None), "http_session", None)
    verify = getattr(session, "_verify", None)
    if verify is None or verify is False:
        return None
    return str(get_cert_path(verify))


async def presigned(fs: Any, bucket: str, key: str) -> str:
    """A presigned GET URL of `bucket`/`key` from `fs`'s s3fs client (its endpoint and
    credentials; unsigned when the filesystem is anonymous). Call after
    ``await fs.set_session()``."""
    params = {"Bucket": bucket, "Key": key}
    return str(await fs.s3.generate_presigned_url("get_object", Params=params, ExpiresIn=3600))


class _Readers:
    """Daemon threads that run blocking GETs (started as needed, at most `MAX_READERS`;
    a process exits without waiting for them, as it does for fsspec's loop)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads = 0
        self.idle = 0

    def submit(self, call: Any, *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self.lock:
            if not self.idle and self.threads < MAX_READERS:
                self.threads += 1
                threading.Thread(target=self._run, name=f"resumeloader-get-{self.threads}",
                                 daemon=True).start()
            else:
                self.idle -= bool(self.idle)
        self.tasks.put((future, call, args))
        return future

    def _run(self) -> None:
        while True:
            future, call, args = self.tasks.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call(*args))
                except BaseException as err:  # handed to the awaiting GET
                    future.set_exception(err)
            del future, call, args
            with self.lock:
                self.idle += 1


_state: dict[str, Any] = {}
_state_lock = threading.Lock()
_counts = {"gets": 0, "in_flight": 0}


def _forget() -> None:
    _state.clear()
    _counts.update(gets=0, in_flight=0)


def stats() -> dict[str, int]:
    """This process's GETs sent this way so far, and those a reader thread still runs
    (given up ones too, until their reader stops)."""
    with _state_lock:
        return dict(_counts)


def _count(key: str, step: int) -> None:
    with _state_lock:
        _counts[key] += step


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _shared(ca_certs: str) -> tuple[_Readers, Any]:
    """The process's reader threads, and its connection pools checking certificates
    against `ca_certs` (a CA bundle's path)."""
    with _state_lock:
        if not _state:
            _state["readers"] = _Readers()
        pools = _state.setdefault("pools", {})
        if ca_certs not in pools:
            import urllib3

            pools[ca_certs] = urllib3.PoolManager(
                maxsize=MAX_READERS, cert_reqs="CERT_REQUIRED", ca_certs=ca_certs,
            )
        return _state["readers"], pools[ca_certs]


async def get(url: str, headers: dict[str, str], size: int, into: np.ndarray | None,
              timeout: float, ca_certs: str) -> tuple[int, Any, Any]:
    """GET `url` (presigned) with `headers` in a reader thread, checking an HTTPS
    server's certificate against `ca_certs`: (status, ETag, body) —
    the body received into `into` (uint8, `size` long) or into recycled memory, one
    byte more than `size` when the answer is longer (see `protocols.received`).

    Raises:
        answers.RedirectError: a redirect to another origin (not followed).
        botocore.exceptions.ClientError: an error status (S3's code and message).
        TimeoutError: no answer or no more of the body within `timeout` seconds.
    """
    readers, pool = _shared(ca_certs)
    cancel = threading.Event()
    future = readers.submit(_get, pool, url, headers, size, into, timeout, cancel)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        cancel.set()  # the reader stops before its next write
        raise


def _get(pool: Any, url: str, headers: dict[str, str], size: int, into: np.ndarray | None,
         timeout: float, cancel: threading.Event) -> tuple[int, Any, Any]:
    _count("gets", 1)
    _count("in_flight", 1)
    try:
        return _sent(pool, url, headers, size, into, timeout, cancel)
    finally:
        _count("in_flight", -1)


def _sent(pool: Any, url: str, headers: dict[str, str], size: int, into: np.ndarray | None,
          timeout: float, cancel: threading.Event) -> tuple[int, Any, Any]:
    import urllib3

    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        left = deadline - time.monotonic()
        if left <= 0 or cancel.is_set():
            break
        answer = pool.request(
            "GET", url, headers=headers, preload_content=False, decode_content=False,
            redirect=False, retries=False,
            timeout=urllib3.Timeout(connect=min(10.0, left), read=left),
        )
        try:
            if 300 <= answer.status < 400 and answer.headers.get("Location"):
                url = _follow(url, answer)
                answer.drain_conn()
                continue
            if answer.status >= 300:
                raise _error(url, answer)
            data = _received(answer, size, into, deadline, cancel)
        except BaseException:
            answer.close()  # the connection is not reused
            raise
        answer.release_conn()
        return answer.status, answer.headers.get("ETag"), data
    if cancel.is_set():
        raise Cancelled("the GET was given up")
    if time.monotonic() >= deadline:
        raise TimeoutError(f"no answer within {timeout} s")
    raise OSError(f"GET {answers.shown(url)}: more than {MAX_REDIRECTS} redirects")


def _follow(url: str, answer: Any) -> str:
    """Where a redirect of `url` leads, when it is on the same origin."""
    location = answer.headers["Location"]
    target = urljoin(url, location)
    here, there = urlsplit(url), urlsplit(target)
    if (here.scheme, here.hostname, here.port) != (there.scheme, there.hostname, there.port):
        raise answers.refused_redirect("GET", url, answer.status, location)
    return target


def _error(url: str, answer: Any) -> Exception:
    """botocore's ClientError of an error answer (S3's XML code and message)."""
    import xml.etree.ElementTree as ElementTree

    from botocore.exceptions import ClientError

    body = answer.read(_ERROR_BYTES, decode_content=True) or b""
    code, message = str(answer.status), answer.reason or ""
    try:
        root = ElementTree.fromstring(body)
        code = root.findtext("Code") or code
        message = root.findtext("Message") or message
    except ElementTree.ParseError:
        pass
    response = {"Error": {"Code": code, "Message": message},
                "ResponseMetadata": {"HTTPStatusCode": answer.status,
                                     "HTTPHeaders": dict(answer.headers)}}
    return ClientError(response, "GetObject")


def _received(answer: Any, size: int, into: np.ndarray | None, deadline: float,
              cancel: threading.Event) -> np.ndarray:
    """The body of `answer`, read into `into` or recycled memory (one byte more than
    `size` when the body is longer); each read straight from the socket into place
    (the ``http.client`` response under urllib3's, when there is one)."""
    source: Any = getattr(answer, "_fp", None)
    readinto = getattr(source, "readinto", None) or answer.readinto
    out = into if into is not None else buffers.empty((size + 1,), np.uint8)
    view, got = out.data, 0
    while got < len(out):
        if cancel.is_set():
            raise Cancelled("the GET was given up")
        if time.monotonic() > deadline:
            raise TimeoutError("the body did not arrive in time")
        n = readinto(view[got : got + PIECE])
        if not n:
            return out[:got]
        got += n
    if into is not None:
        if readinto(memoryview(bytearray(1))):
            return np.zeros(size + 1, np.uint8)  # longer: only its length is looked at
        return into
    return out
