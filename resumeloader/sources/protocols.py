"""One ranged GET of an object, per protocol, pinned to the version the source saw.

`get_once` reads bytes ``[start, stop)`` of an `Object` once (no retry: the caller,
`resumeloader.sources.fetch`, retries) through its fsspec filesystem: S3 and HTTP with
``If-Match`` on the object's ETag, GCS with ``generation=``, and the answer's version
checked too; ``memory://`` objects by size and creation time. A precondition that
fails (the object changed or is gone) is `ObjectChangedError`, naming the object, its
old version and what it is now. `retryable` says which failures are worth another try.
"""

from __future__ import annotations

import errno

from resumeloader.sources import handles, retry, storage

__all__ = ["ObjectChangedError", "changed", "get_once", "retryable"]


class ObjectChangedError(handles.StaleFileError):
    """An object is not the version the source was built from (it was rewritten or
    deleted): nothing of it is read. Build the source again to read the new data."""


async def changed(obj: storage.Object, why: str) -> ObjectChangedError:
    fs = storage.filesystem(obj.protocol, obj.options)
    path = storage.strip(obj.protocol, obj.url)
    try:
        if hasattr(fs, "invalidate_cache"):
            fs.invalidate_cache(path)
        info = await fs._info(path)
        current = f"it is now version {storage.version_of(obj.protocol, info) or '?'} of " + (
            f"{info.get('size')} bytes"
        )
    except FileNotFoundError:
        current = "it no longer exists"
    except Exception as err:  # the look is only for the message
        current = f"its current version is unknown ({type(err).__name__}: {err})"
    msg = (
        f"Object {obj} changed since the source was built: it was version "
        f"{obj.version or '?'} of {obj.size} bytes, {current} ({why}). A changed object "
        "is never read (its records would mix old and new bytes). Build the source again "
        "to read the new data; a checkpoint of the old data is refused by the new source."
    )
    return ObjectChangedError(errno.ESTALE, msg)


async def get_once(obj: storage.Object, start: int, stop: int) -> bytes:
    proto = obj.protocol
    fs = storage.filesystem(proto, obj.options)
    span = f"bytes={start}-{stop - 1}"
    if proto == "s3":
        bucket, _, key = obj.url.split("://", 1)[1].partition("/")
        kw = {"Bucket": bucket, "Key": key, "Range": span}
        if obj.version:
            kw["IfMatch"] = obj.version
        try:
            response = await fs._call_s3("get_object", **kw)
        except Exception as err:
            if retry.http_status(err) == 412:
                raise await changed(obj, "If-Match failed") from err
            raise
        body = response["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        got = response.get("ETag")
        if obj.version and got and got != obj.version:
            raise await changed(obj, f"the answer is version {got}")
        return bytes(data)
    if proto == "gcs":
        url = fs.url(obj.url.split("://", 1)[1], generation=obj.version or None)
        request = getattr(type(fs)._request, "__wrapped__", None)  # one try: ours retry
        try:
            if request is not None:
                _, headers, _, data = await request(fs, "GET", url, headers={"Range": span})
            else:
                _, headers, _, data = await fs._request("GET", url, headers={"Range": span})
        except FileNotFoundError as err:
            if obj.version:
                raise await changed(obj, f"generation {obj.version} is gone") from err
            raise
        got = headers.get("x-goog-generation")
        if obj.version and got and got != obj.version:
            raise await changed(obj, f"the answer is generation {got}")
        return bytes(data)
    if proto == "http":
        headers = {"If-Match": obj.version} if obj.version else {}
        try:
            return bytes(await fs._cat_file(obj.url, start=start, end=stop, headers=headers))
        except Exception as err:
            if retry.http_status(err) == 412:
                raise await changed(obj, "If-Match failed") from err
            raise
    info = fs.info(obj.url)  # memory://: in this process, synchronous
    if (info["size"], storage.version_of(proto, info)) != (obj.size, obj.version):
        raise await changed(obj, "its size or creation time differs")
    return bytes(fs.cat_file(obj.url, start=start, end=stop))


def retryable(err: BaseException) -> bool:
    """Whether a GET that failed with `err` is worth another try (`retry.transient`;
    never a changed object)."""
    return not isinstance(err, ObjectChangedError) and retry.transient(err)
