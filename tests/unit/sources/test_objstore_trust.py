"""Trust at the edges of object storage: redirects, versions, refusals, ignored ranges.

Real servers (moto's S3 server, fake-gcs-server; `_objstore_fixtures`) behind the
`FaultProxy`, which answers chosen requests with a redirect — to another origin (an
`OtherOrigin` server serving junk or other TFRecords, echoing ``If-Match`` as its ETag
or not) or to itself — a 401/403, or the whole object for a ranged GET. No TensorFlow.
"""

from __future__ import annotations

import _objstore
import numpy as np
import pytest
from _objstore_fixtures import FAST, put_tfrecords, records, source

from resumeloader.sources import (
    CorruptRecordError,
    FileSource,
    RecordReadError,
    Storage,
    TFRecordSource,
)
from resumeloader.sources.storage import answers, fetch

STATUSES = (301, 302, 307, 308)


def _http_url(store, key: str, written: list[bytes]) -> str:
    """A public TFRecord object of the S3 server, as a plain ``http://`` URL through the proxy."""
    store.put(key, _objstore.tfrecord_bytes(written), ACL="public-read")
    return f"{store.proxy.url}/{store.bucket}/{key}"


def _other_records(count: int, size: int = 300) -> bytes:
    """TFRecords that frame correctly but hold other data (what a hostile origin serves)."""
    return _objstore.tfrecord_bytes(records(9, count, size))


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("echo", [True, False], ids=["etag-echo", "own-etag"])
def test_get_redirected_to_another_origin_is_refused(store, tmp_path, status, echo):
    """A ranged GET answered 301/302/307/308 to another origin (other TFRecords, the
    If-Match echoed as the ETag or not): nothing is read there, the error names both."""
    url, _ = put_tfrecords(store, files=1, count=20)
    src = source(store, url, tmp_path)
    with _objstore.OtherOrigin(_other_records(20), echo=echo) as other:
        fetch.clear()
        store.proxy.inject("redirect", 1, status=status, to=other.url)
        try:
            with pytest.raises(RecordReadError) as info:
                src.read(3)
        finally:
            store.proxy.clear()
    message = str(info.value)
    assert f"answered {status} with a redirect to another origin, {other.url}/" in message
    assert f"Reading {url.replace('*', '0')}: GET " in message  # the object, the URL asked
    assert other.requests == []  # never reached
    assert isinstance(info.value.__cause__, answers.RedirectError)


@pytest.mark.parametrize("where", ["head", "list"])
def test_lookup_and_listing_redirected_to_another_origin_are_refused(store, tmp_path, where):
    """Building a source: a look-up (one object) or a listing (a glob) redirected to
    another origin is a RedirectError naming the URL and the Location."""
    url, _ = put_tfrecords(store, files=2, count=5)
    named = url.replace("*", "1") if where == "head" else url
    with _objstore.OtherOrigin(echo=True) as other:
        # Every attempt redirected: under load a look-up can time out client-side and be
        # retried (FAST's 1 s timeout), and a retry that is not redirected succeeds.
        store.proxy.inject("redirect", FAST.attempts, where=(where,), to=other.url)
        try:
            with pytest.raises(answers.RedirectError) as info:
                source(store, named, tmp_path)
        finally:
            store.proxy.clear()
    assert info.value.location.startswith(other.url) and other.requests == []
    assert "redirect to another origin" in str(info.value)


@pytest.mark.parametrize("status", STATUSES)
def test_http_redirect_to_another_origin_is_refused(s3_store, tmp_path, status):
    """``http(s)://``: the same for the look-up and the GET of a plain URL."""
    folder = s3_store.folder()
    url = _http_url(s3_store, f"{folder}/h.tfrecord", records(0, 20))
    src = TFRecordSource(url, index_dir=tmp_path / "ix", storage=Storage(reads=FAST))
    with _objstore.OtherOrigin(_other_records(20), echo=True) as other:
        fetch.clear()
        s3_store.proxy.inject("redirect", 2, where=("read", "head"), status=status, to=other.url)
        try:
            with pytest.raises(RecordReadError, match="redirect to another origin"):
                src.read(5)
            with pytest.raises(answers.RedirectError, match="redirect to another origin"):
                TFRecordSource(url, index_dir=tmp_path / "ix2")
        finally:
            s3_store.proxy.clear()
    assert other.requests == []


def test_same_origin_redirect_is_followed_to_the_pinned_version(store, tmp_path):
    """A redirect to the same origin is followed; its answer is the pinned version, so the
    records are the ones written."""
    url, every = put_tfrecords(store, files=2, count=10)
    src = source(store, url, tmp_path)
    fetch.clear()
    store.proxy.inject("redirect", 2, status=307)
    try:
        got = src.read_batch(np.array([3, 15]))
    finally:
        store.proxy.clear()
    assert got == [every[3], every[15]]


def test_same_origin_redirect_to_another_version_names_the_versions(store, tmp_path):
    """A redirect on the same origin to another object: its answer is another version,
    refused as an answer from elsewhere, naming the pinned version (still current)."""
    url, _ = put_tfrecords(store, files=2, count=10)
    src = source(store, url, tmp_path)
    pinned = src._locations[0].version
    fetch.clear()
    store.proxy.inject("redirect", 1, path=lambda path: path.replace("part-0", "part-1"))
    try:
        with pytest.raises(CorruptRecordError) as info:
            src.read(2)
    finally:
        store.proxy.clear()
    message = str(info.value)
    assert "part-0.tfrecord was answered as another version" in message
    # what it saw: the answer's version, or S3's refusal of the pinned one (412); the
    # pinned version named once (0.3 named it twice, as if it were the answer's too)
    seen = "the answer is 404: no such version" if store.kind == "gcs" else "If-Match failed"
    assert seen in message and message.count(pinned) == 1
    assert f"the object is still version {pinned} of " in message


def test_http_answer_of_another_version_is_refused(s3_store, tmp_path):
    """``http(s)://`` answers are checked against the pinned ETag too (a same-origin
    redirect to another object is never read as this one)."""
    folder = s3_store.folder()
    url = _http_url(s3_store, f"{folder}/a.tfrecord", records(0, 10))
    _http_url(s3_store, f"{folder}/b.tfrecord", records(1, 10))
    src = TFRecordSource(url, index_dir=tmp_path / "ix", storage=Storage(reads=FAST))
    other = FileSource(url.replace("/a.", "/b."))._locations[0].version
    fetch.clear()
    s3_store.proxy.inject("redirect", 1, path=lambda path: path.replace("/a.", "/b."))
    try:
        with pytest.raises(CorruptRecordError, match="the object is still version") as info:
            src.read(1)
    finally:
        s3_store.proxy.clear()
    pinned = src._locations[0].version
    assert "If-Match failed" in str(info.value) and pinned != other
    assert f"still version {pinned} of" in str(info.value)


def test_http_server_ignoring_if_match_names_both_versions(tmp_path):
    """A plain HTTP server that ignores ``If-Match`` and now answers with another ETag:
    refused, naming the version pinned and the one answered (0.3 named one twice)."""
    with _objstore.OtherOrigin(_other_records(10), etag='"v1"') as server:
        url = f"{server.url}/data.tfrecord"
        src = TFRecordSource(url, index_dir=tmp_path / "ix", storage=Storage(reads=FAST))
        server.etag = '"v2"'
        fetch.clear()
        with pytest.raises(CorruptRecordError) as info:
            src.read(1)
    message = str(info.value)
    assert 'it was version "v1" of ' in message and 'it is now version "v2" of ' in message
    assert '(the answer is version "v2")' in message


def test_server_ignoring_range_is_named_and_not_retried(store, tmp_path):
    """A ranged GET answered 200 with the whole object: named as such, no second try."""
    url, _ = put_tfrecords(store, files=1, count=30)
    src = source(store, url, tmp_path)
    retries = fetch.stats()["retries"]
    with store.faults("norange", 10) as proxy:
        with pytest.raises(RecordReadError) as info:
            src.read(4)
        assert proxy.faulted["norange"] == 1 and fetch.stats()["retries"] == retries
    assert "ignores the Range header" in str(info.value)
    assert isinstance(info.value.__cause__, answers.RangeIgnoredError)


@pytest.mark.parametrize("status", ["401", "403"])
def test_refused_get_is_a_permission_error_naming_object_and_status(store, tmp_path, status):
    """A GET answered 401/403: a PermissionError naming the object and the status, not
    retried."""
    url, _ = put_tfrecords(store, files=1, count=10)
    src = source(store, url, tmp_path)
    with store.faults(status, 10) as proxy:
        with pytest.raises(RecordReadError) as info:
            src.read(2)
        assert proxy.faulted[status] == 1
    cause = info.value.__cause__
    assert isinstance(cause, PermissionError) and cause.status == int(status)
    assert f"HTTP {status}" in str(info.value) and "part-0.tfrecord" in str(info.value)


@pytest.mark.parametrize("where", ["head", "list"])
def test_refused_lookup_is_a_permission_error(store, tmp_path, where):
    """Building a source whose look-up or listing is answered 403: a PermissionError
    naming what was asked and the status (not "does not exist")."""
    url, _ = put_tfrecords(store, files=1, count=5)
    named = url.replace("*", "0") if where == "head" else url
    # gcsfs looks an object up by listing when its GET of metadata is refused: refuse both
    store.proxy.inject("403", 5, where=("head", "list") if where == "head" else (where,))
    try:
        with pytest.raises(PermissionError, match="HTTP 403") as info:
            source(store, named, tmp_path)
    finally:
        store.proxy.clear()
    assert store.bucket in str(info.value)


def test_expired_signed_http_url_is_a_permission_error(s3_store, tmp_path):
    """An ``http(s)://`` URL answered 403 (an expired signed URL): a PermissionError
    naming the URL, without its query (the signature), and the status."""
    folder = s3_store.folder()
    url = _http_url(s3_store, f"{folder}/s.tfrecord", records(0, 5))
    s3_store.proxy.inject("403", 5, where=("head", "read"))
    try:
        with pytest.raises(PermissionError, match="HTTP 403") as info:
            FileSource(url + "?X-Amz-Signature=secret")
    finally:
        s3_store.proxy.clear()
    assert url in str(info.value) and "secret" not in str(info.value)


def test_object_deleted_under_a_reader_is_named_after_read_ahead(store, tmp_path):
    """An object deleted after the source was built, with reads ahead of it in flight:
    the read names that object as changed (gone), never a bare CancelledError."""
    url, every = put_tfrecords(store, files=2, count=20)
    src = source(store, url, tmp_path)
    fetch.clear()
    store.direct.rm(url.split("://", 1)[1].replace("*", "1"))
    src.prefetch(np.arange(40))
    assert src.read(0) == every[0]
    with pytest.raises(CorruptRecordError) as info:
        src.read(30)
    assert "part-1.tfrecord changed since the source was built" in str(info.value)
    assert "it no longer exists" in str(info.value) and info.value.record_index == 30


def test_fetch_clear_while_gets_are_in_flight_loses_no_read(s3_store, tmp_path):
    """`fetch.clear()` with GETs in flight (read ahead, and a reader waiting on them):
    the reads still return their records; nothing is cancelled under them."""
    url, every = put_tfrecords(s3_store, files=4, count=20)
    src = source(s3_store, url, tmp_path)
    fetch.clear()
    s3_store.proxy.latency = 0.3
    try:
        assert src.prefetch(np.arange(80))
        fetch.clear()  # the read-ahead in flight is forgotten, not cancelled
        got = src.read_batch(np.arange(0, 80, 7))
    finally:
        s3_store.proxy.latency = 0.0
    assert got == every[0:80:7]


def test_empty_object_as_the_whole_source_is_named(store, tmp_path):
    """A single empty TFRecord object: a ValueError naming its URL and size, not a bare
    "`source` must hold at least one record"."""
    url = store.put(f"{store.folder()}/empty.tfrecord", b"")
    with pytest.raises(ValueError) as info:
        source(store, url, tmp_path)
    assert f"{url} (0 bytes)" in str(info.value)
