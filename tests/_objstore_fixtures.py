"""Session fixtures: moto's S3 server and fake-gcs-server, each behind a `FaultProxy`.

`s3_store` and `gcs_store` start their server once per test session (per xdist
worker), on 127.0.0.1 ports the OS picks, and stop it after the last test. Tests and
conformance entries reach the server through the proxy with explicit
storage options (`Store.options`, `Store.storage`), so that faults can be injected; setting up
data goes to the server directly (`Store.put`). A test that injects faults clears
them after itself (`Store.faults`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Iterator
from typing import Any

import _objstore
import pytest

from resumeloader.sources import ObjectReads, Storage
from resumeloader.sources.storage import fetch

#: The running stores by kind ("s3", "gcs"), for conformance entries (set by the fixtures).
ACTIVE: dict[str, Store] = {}
_names = itertools.count()


@dataclasses.dataclass
class Store:
    """One running object store and the proxy in front of it."""

    kind: str  # "s3" or "gcs"
    scheme: str  # "s3" or "gs"
    endpoint: str  # the server itself
    proxy: _objstore.FaultProxy
    bucket: str
    direct: Any  # an fsspec filesystem on the server, bypassing the proxy

    @property
    def options(self) -> dict[str, Any]:
        """Filesystem options reaching the server through the proxy."""
        if self.kind == "s3":
            return {
                "endpoint_url": self.proxy.url, "key": "testing", "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"},
            }
        return {"endpoint_url": self.proxy.url, "token": "anon", "project": "test"}

    @property
    def environment(self) -> dict[str, str]:
        """The standard environment reaching the server through the proxy."""
        if self.kind == "s3":
            return _objstore.s3_environment(self.proxy.url)
        return _objstore.gcs_environment(self.proxy.url)

    def storage(self, reads: ObjectReads | None = None, **kwargs: Any) -> Storage:
        """A `Storage` reaching the server through the proxy (`FAST` reads by default)."""
        return Storage(options=self.options, reads=reads or FAST, **kwargs)

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def folder(self) -> str:
        """A fresh key prefix (a folder of its own for one test)."""
        return f"t{next(_names)}"

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:
        """Writes `data` at `key` on the server (not through the proxy); its URL.
        `kwargs` go to the filesystem (e.g. ``ACL="public-read"`` on S3)."""
        self.direct.pipe_file(f"{self.bucket}/{key}", data, **kwargs)
        return self.url(key)

    @contextlib.contextmanager
    def faults(self, kind: str, count: int) -> Iterator[_objstore.FaultProxy]:
        """The next `count` object reads through the proxy fail with `kind` (cleared after);
        the process's span cache is emptied first, so that reads reach the proxy."""
        fetch.clear()
        self.proxy.clear()
        self.proxy.inject(kind, count)
        try:
            yield self.proxy
        finally:
            self.proxy.clear()


@pytest.fixture(scope="session")
def s3_store() -> Iterator[Store]:
    """moto's S3 server behind a fault proxy, with a bucket."""
    import s3fs

    with _objstore.s3_server() as endpoint, _objstore.FaultProxy(endpoint) as proxy:
        direct = s3fs.S3FileSystem(
            endpoint_url=endpoint, key="testing", secret="testing", skip_instance_cache=True,
        )
        direct.call_s3("create_bucket", Bucket="data")
        store = Store("s3", "s3", endpoint, proxy, "data", direct)
        ACTIVE["s3"] = store
        try:
            yield store
        finally:
            ACTIVE.pop("s3", None)


@pytest.fixture(scope="session")
def gcs_store() -> Iterator[Store]:
    """fake-gcs-server behind a fault proxy, with a bucket."""
    import gcsfs.core

    with _objstore.gcs_server() as endpoint, _objstore.FaultProxy(endpoint) as proxy:
        direct = gcsfs.core.GCSFileSystem(
            endpoint_url=endpoint, token="anon", project="test", skip_instance_cache=True
        )
        direct.mkdir("data")
        store = Store("gcs", "gs", endpoint, proxy, "data", direct)
        ACTIVE["gcs"] = store
        try:
            yield store
        finally:
            ACTIVE.pop("gcs", None)


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each object store in turn."""
    return request.getfixturevalue(f"{request.param}_store")


# -- data for the tests -------------------------------------------------------------------
#: Object reads that give up fast (a test of failures waits seconds, not minutes): quick
#: retries (a "slow" fault outlasts `timeout`), and a deadline that a loaded CI machine,
#: whose in-process server can stall for seconds, does not reach before the tries end.
FAST = ObjectReads(attempts=4, backoff=0.01, timeout=1.0, deadline=30.0)


def records(file: int, count: int, size: int = 300) -> list[bytes]:
    """`count` distinct records of about `size` bytes, tagged with `file`."""
    return [b"%d:%d:" % (file, i) + bytes([i % 251]) * size for i in range(count)]


def tfrecord_files(folder: str, count: int = 3, per_file: int = 50,
                   size: int = 200) -> tuple[list[str], list[bytes]]:
    """`count` local TFRecord files of `per_file` `records` each (about ``size + 7 *
    file`` bytes: other sizes per file) in `folder`; (paths, all records in file order)."""
    paths, every = [], []
    for file in range(count):
        data = records(file, per_file, size + 7 * file)
        path = os.path.join(folder, f"part-{file}.tfrecord")
        with open(path, "wb") as out:
            out.write(_objstore.tfrecord_bytes(data))
        paths.append(path)
        every += data
    return paths, every


def put_tfrecords(
    store: Store, files: int = 3, count: int = 40, size: int = 300
) -> tuple[str, list[bytes]]:
    """`files` TFRecord objects of `count` records in a fresh folder; (glob URL, all records)."""
    folder = store.folder()
    every = []
    for file in range(files):
        data = records(file, count, size)
        store.put(f"{folder}/part-{file}.tfrecord", _objstore.tfrecord_bytes(data))
        every += data
    return store.url(f"{folder}/part-*.tfrecord"), every


def source(
    store: Store, url: str, tmp_path: Any, *, reads: ObjectReads | None = None, **kwargs: Any
) -> Any:
    """A `TFRecordSource` of `url` through the store's proxy (`FAST` reads by default)."""
    from resumeloader.sources import TFRecordSource

    folder = tmp_path / "index"
    return TFRecordSource(url, index_dir=folder, storage=store.storage(reads), **kwargs)


def packed_strings(column: Any) -> list[bytes]:
    """The records of a packed (or plain) wire column of TFRecord strings, decoded from
    its bytes; the strings it may carry (made to check them, `wire.with_strings`) are
    asserted to be the same."""
    import numpy as np

    from resumeloader.core import spec as spec_lib
    from resumeloader.core import wire

    leaf = spec_lib.RecordSpec.of(b"").leaves[0]
    from_bytes = list(wire.decode(np.array(column), leaf))  # a plain copy carries none
    carried = getattr(column, "strings", None)
    assert carried is None or carried == from_bytes
    assert list(wire.decode(column, leaf)) == from_bytes
    return from_bytes
