"""Buckets of many small objects: what building a source costs, counted at the proxy.

Building a source over a glob lists the folder, takes sizes and versions from the
listing, finds sidecar indexes with one more listing of the folder, and then reads each
object (or its sidecar) once: at most one request per object besides the listings. The
time for 10,000 objects is measured by ``benchmarks/bench_objstore.py --build-only``,
not here. No TensorFlow.
"""

from __future__ import annotations

import _objstore
import numpy as np
from _objstore_fixtures import records, source

from resumeloader import cli
from resumeloader.sources import FileSource
from resumeloader.sources.storage import fetch

OBJECTS = 120


def _bucket(store, count: int = OBJECTS) -> tuple[str, list[bytes]]:
    folder = store.folder()
    every = []
    for file in range(count):
        data = records(file, 2, size=40)
        store.put(f"{folder}/part-{file:04d}.tfrecord", _objstore.tfrecord_bytes(data))
        every += data
    return store.url(f"{folder}/part-*.tfrecord"), every


def test_building_over_a_glob_reads_each_object_once(store, tmp_path):
    """No sidecars: one GET per object (its index), no look-up per object, two listings."""
    url, every = _bucket(store)
    fetch.clear()
    store.proxy.clear()
    src = source(store, url, tmp_path)
    requests = dict(store.proxy.requests)
    assert requests.get("read") == OBJECTS and not requests.get("head")
    assert requests.get("list") == 1  # one listing: the matches and their sidecars
    assert sum(requests.values()) <= 1.05 * OBJECTS
    assert src.read_batch(np.array([0, 239])) == [every[0], every[239]]


def test_building_over_a_glob_with_sidecars_reads_no_object(store, tmp_path, monkeypatch):
    """Sidecars written by ``resumeloader index``: one GET per sidecar, none of an object."""
    url, _ = _bucket(store)
    for key, value in store.environment.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["index", url]) == 0
    fetch.clear()
    store.proxy.clear()
    source(store, url, tmp_path)
    requests = dict(store.proxy.requests)
    assert requests.get("read") == OBJECTS and not requests.get("head")
    assert store.proxy.bytes_sent == OBJECTS * (128 + 8 * 2)  # the sidecars' bytes only
    assert sum(requests.values()) <= 1.05 * OBJECTS


def test_file_source_over_a_glob_costs_only_the_listing(store):
    """A FileSource over a glob reads nothing when built: sizes and versions come from
    the listing."""
    url, _ = _bucket(store)
    store.proxy.clear()
    src = FileSource(url, storage=store.storage())
    assert len(src) == OBJECTS
    assert not store.proxy.requests.get("read") and not store.proxy.requests.get("head")
