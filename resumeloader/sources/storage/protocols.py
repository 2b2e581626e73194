"""One ranged GET of an object, per protocol, pinned to the version the source saw.

`get_once` reads bytes ``[start, stop)`` of an `Object` once (no retry: the caller,
`resumeloader.sources.storage.fetch`, retries) through its fsspec filesystem's
session: S3 and HTTP with ``If-Match`` on the object's ETag, GCS with ``generation=``,
and every answer's version checked against the pinned one too (a redirect on the same
origin is followed only to an answer of that version; to another origin, never:
`resumeloader.sources.storage.answers`); ``memory://`` objects by size and creation
time. A precondition that fails, an answer of another version or an object gone is
`ObjectChangedError`, naming the object and every version seen; a 401/403 is
`AccessDeniedError`, a server ignoring ``Range`` `RangeIgnoredError`. `retryable` says
which failures are worth another try.

An S3 GET is sent from a presigned URL by urllib3 in a reader thread, each socket read
landing in recycled memory (`resumeloader.core.buffers`) or the buffer it was given
(`resumeloader.sources.storage.direct`; s3fs's own GET where that cannot be used); an
HTTP GET reads aiohttp's chunks into place; GCS and ``memory://`` hand back the body as
their library received it.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from resumeloader.core import buffers
from resumeloader.sources.storage import answers, direct, filesystems, handles, objects, retry

#: Bytes = bytes or an array of uint8 of the body (recycled memory).
Body = Any

__all__ = ["ObjectChangedError", "changed", "get_once", "received", "retryable"]


class ObjectChangedError(handles.StaleFileError):
    """An object is not the version the source was built from (it was rewritten or
    deleted), or an answer came back of another version: nothing of it is read. Build
    the source again to read the new data.

    Attributes:
        url: the object.
    """


async def changed(obj: objects.Object, why: str) -> ObjectChangedError:
    """The error of an answer that is not `obj`'s pinned version (`why`: what the answer
    was). The object is looked up again, to tell an object that changed from an answer
    that came from elsewhere (the object still its pinned version)."""
    try:
        info = await objects.info(obj.url, obj.options)
        now = objects.version_of(obj.protocol, info)
        current = f"it is now version {now or '?'} of {info.get('size')} bytes"
        same = (now, int(info.get("size", -1))) == (obj.version, obj.size)
    except FileNotFoundError:
        current, same = "it no longer exists", False
    except Exception as err:  # the look is only for the message
        current, same = f"its current version is unknown ({type(err).__name__}: {err})", False
    if same:
        msg = (
            f"A GET of {obj} was answered as another version ({why}), but the object is "
            f"still version {obj.version or '?'} of {obj.size} bytes: the answer came from "
            "elsewhere (a redirect, a proxy or a cache in between) and none of it is read."
        )
    else:
        msg = (
            f"Object {obj} changed since the source was built: it was version "
            f"{obj.version or '?'} of {obj.size} bytes, {current} ({why}). A changed "
            "object is never read (its records would mix old and new bytes). Build the "
            "source again to read the new data; a checkpoint of the old data is refused by "
            "the new source."
        )
    return ObjectChangedError(errno.ESTALE, msg, url=obj.url)


def _range_ignored(obj: objects.Object, start: int, stop: int, received: int) -> Exception:
    got = f"{received} bytes" if received <= stop - start else f"more than {stop - start} bytes"
    msg = (
        f"The server of {obj} ignores the Range header: asked for bytes [{start}, {stop}), "
        f"it answered 200 with {got} (the whole object). Ranged reads need a "
        "server (or proxy) that serves ranges; nothing is retried."
    )
    return answers.RangeIgnoredError(msg, url=obj.url)


async def _failed(obj: objects.Object, err: BaseException) -> BaseException | None:
    """What a failed GET of `obj` is, when it is more than the error itself: a changed or
    gone object, a refusal, a redirect to another origin."""
    refused = retry.found(err, answers.RedirectError)
    if refused is not None:
        msg = f"Reading {obj}: {refused.strerror}"
        return answers.RedirectError(msg, url=obj.url, location=refused.location)
    status = retry.http_status(err)
    if status == 412:
        return await changed(obj, "If-Match failed: the answer is of another version")
    if status in (401, 403) or retry.forbidden(err):
        return answers.denied(obj.url, status or 403)
    if obj.version and (status in (404, 410) or isinstance(err, FileNotFoundError)):
        return await changed(obj, f"the answer is {status or 404}: no such version")
    return None


async def _checked(obj: objects.Object, start: int, stop: int, status: int, got: Any,
                   data: Body) -> Body:
    if status == 200 and (start, stop) != (0, obj.size):
        raise _range_ignored(obj, start, stop, len(data))
    if obj.version and str(got or "") != obj.version:
        raise await changed(obj, f"the answer is version {got or 'none'}")
    return data


async def received(readinto: Callable[[memoryview], Awaitable[int]], size: int,
                   into: np.ndarray | None = None) -> np.ndarray:
    """A body of `size` bytes expected, received by ``readinto(buffer)`` calls (each
    fills the start of `buffer` and returns how much; 0 at the end) into recycled
    memory, or into `into` (uint8, `size` long: a part of a larger buffer): the uint8
    array of what came (one byte more than `size` when the body is longer, so that its
    length tells)."""
    if into is not None:
        view, got = into.data, 0
        while got < size:
            n = await readinto(view[got:])
            if not n:
                return into[:got]
            got += n
        if await readinto(memoryview(bytearray(1))):
            return np.zeros(size + 1, np.uint8)  # longer: only its length is looked at
        return into
    out = buffers.empty((size + 1,), np.uint8)
    view = out.data
    got = 0
    while got <= size:
        n = await readinto(view[got:])
        if not n:
            break
        got += n
    return out[:got]


async def get_once(obj: objects.Object, start: int, stop: int,
                   into: np.ndarray | None = None, timeout: float = 30.0) -> Body:
    """Bytes [start, stop) of `obj`, in one try (received into `into`, uint8 of
    ``stop - start`` bytes, when given) within `timeout` seconds.

    Raises:
        ObjectChangedError, AccessDeniedError, RangeIgnoredError, RedirectError: see the
            module docstring; or the library's error (see `retryable`).
    """
    proto = obj.protocol
    fs = filesystems.filesystem(proto, obj.options)
    span = f"bytes={start}-{stop - 1}"
    try:
        if proto == "s3":
            status, got, data = await _s3(fs, obj, span, stop - start, into, timeout)
        elif proto == "gcs":
            status, got, data = await _gcs(fs, obj, span)
        elif proto == "http":
            status, got, data = await _http(fs, obj, span, stop - start, into)
        else:
            return _placed(await _memory(fs, obj, start, stop), into)
    except (ObjectChangedError, answers.RangeIgnoredError):
        raise
    except Exception as err:
        better = await _failed(obj, err)
        if better is not None:
            raise better from err
        raise
    return _placed(await _checked(obj, start, stop, status, got, data), into)


def _placed(data: Body, into: np.ndarray | None) -> Body:
    """`data` copied into `into` when it is a body of that length received elsewhere."""
    if into is None or data is into or len(data) != len(into):
        return data
    into[:] = np.frombuffer(data, np.uint8)
    return into


async def _s3(fs: Any, obj: objects.Object, span: str, size: int,
              into: np.ndarray | None, timeout: float) -> tuple[int, Any, Body]:
    bucket, _, key = obj.url.split("://", 1)[1].partition("/")
    if direct.usable(fs):
        await fs.set_session()
        ca_certs = direct.certificates(fs)
        if ca_certs is not None:
            url = await direct.presigned(fs, bucket, key)
            headers = {"Range": span, **({"If-Match": obj.version} if obj.version else {})}
            return await direct.get(url, headers, size, into, timeout, ca_certs)
    kw = {"Bucket": bucket, "Key": key, "Range": span}
    if obj.version:
        kw["IfMatch"] = obj.version
    response = await fs._call_s3("get_object", **kw)
    body = response["Body"]
    try:
        data = await received(body.readinto, size, into)
    finally:
        body.close()
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
    return int(status), response.get("ETag"), data


async def _gcs(fs: Any, obj: objects.Object, span: str) -> tuple[int, Any, bytes]:
    url = fs.url(obj.url.split("://", 1)[1], generation=obj.version or None)
    request = getattr(type(fs)._request, "__wrapped__", None)  # one try: ours retry
    if request is not None:
        status, headers, _, data = await request(fs, "GET", url, headers={"Range": span})
    else:
        status, headers, _, data = await fs._request("GET", url, headers={"Range": span})
    return int(status), headers.get("x-goog-generation"), bytes(data)


async def _http(fs: Any, obj: objects.Object, span: str, size: int,
                into: np.ndarray | None) -> tuple[int, Any, Body]:
    kwargs = dict(fs.kwargs)
    headers = {**kwargs.pop("headers", {}), "Range": span}
    if obj.version:
        headers["If-Match"] = obj.version
    session = await fs.set_session()
    async with session.get(obj.url, headers=headers, **kwargs) as answer:
        if answer.status >= 300:
            answer.raise_for_status()  # ClientResponseError: its status decides the rest
            msg = f"GET {obj} answered {answer.status} (a redirect that was not followed)."
            raise OSError(errno.EIO, msg)
        content = answer.content

        async def readinto(buffer: memoryview) -> int:
            chunk = await content.read(len(buffer))
            buffer[: len(chunk)] = chunk
            return len(chunk)

        data = await received(readinto, size, into)
        return answer.status, answer.headers.get("ETag"), data


async def _memory(fs: Any, obj: objects.Object, start: int, stop: int) -> bytes:
    info = fs.info(obj.url)  # memory://: in this process, synchronous
    if (info["size"], objects.version_of("memory", info)) != (obj.size, obj.version):
        raise await changed(obj, "its size or creation time differs")
    return bytes(fs.cat_file(obj.url, start=start, end=stop))


def retryable(err: BaseException) -> bool:
    """Whether a GET that failed with `err` is worth another try (`retry.transient`;
    never a changed object, a refusal, a redirect elsewhere or an ignored range)."""
    return not isinstance(err, ObjectChangedError) and retry.transient(err)
