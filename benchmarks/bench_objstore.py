"""Object storage: TFRecord objects in a local S3 server behind 20 ms per request, side by side.

    python benchmarks/bench_objstore.py [--quick] [--rounds 3] [--build-only OBJECTS]
                                        [--unshuffled-only]

Writes 16 TFRecord objects of ``tf.train.Example`` records of 3 KB (20,000 records;
4,000 with ``--quick``) into moto's S3 server on 127.0.0.1, behind a proxy that adds
20 ms to every request (tests/_objstore.py), and the same files on local disk. Every
S3 contender reads with a cache (48 MiB) smaller than the data (about 62 MB), as a
real data set is. Batch 128, ``tf_map(parse_example)``, rounds interleaved, medians:

* ``TFRecordSource`` + ``tf_map`` in the block order (``shuffle(block="4MiB")``: chunks
  of one object, windows of 4 objects; 1 MiB with ``--quick``) over ``s3://``, against
  the same pipeline on local disk (which TensorFlow's reader reads: the
  ``tfrecord_graph`` path), and on local disk by the path ``s3://`` takes (``read_batch``:
  batches made in Python);
* the global shuffle over ``s3://`` (default ``ObjectReads``, and with 64 KiB merge
  gaps), and the unshuffled order (GETs per object a batch touches, over a whole epoch
  from a cold cache; ``--unshuffled-only`` runs only this one);
* the hand-written fsspec source users write today: ``__getitem__`` making one ranged
  ``s3fs`` GET per record (an offset index given, no CRC, no retries), alone and with
  8 thread workers;
* tf.data ``TFRecordDataset`` on the same ``s3://`` URL, if any TensorFlow filesystem
  can read it (TensorFlow 2.21 has none: the error is printed in the table);
* the physical reference: every object read whole, 16 GETs in parallel, no shuffle;
* ArrayRecord objects (the same records), read through local copies of whole objects:
  building the source with an empty copy folder, then epochs, against local files.

Columns: records/s, CPU per record, the first batch, the 99th percentile of the
waits for a batch (the loop does nothing else), GETs per batch, bytes read / bytes
used, minor page faults per batch. The S3 readers choose their read-ahead
(``readahead_bytes="auto"``, the default). Then: restore to the first batch at epoch
50 of a 1,000,000-record object (100,000 with ``--quick``; index cached), median of
5; and one epoch in the block order under each fault kind of the proxy (503, reset,
truncated body, slow body): records lost, duplicated, partial. The slow contenders
are timed over their first batches only.
Last, building a ``TFRecordSource`` over a glob of 10,000 small objects (1,000 with
``--quick``) on the local S3 server without added latency (a server of its own): wall
and CPU seconds and requests per object counted at the proxy, without sidecar indexes
(each object read once) and with them (each sidecar read once); ``--build-only N``
runs only this table, over N objects.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import io
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import _common
import _objstore
import _results
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

from resumeloader import Pipeline, ResumableLoader, Workers
from resumeloader.sources import (
    ArrayRecordSource,
    IndexableSource,
    ObjectReads,
    Storage,
    TFRecordSource,
    tfrecord_index,
)
from resumeloader.sources.storage import fetch
from resumeloader.tfdata import paths as delivery_paths
from resumeloader.tfdata import tfrecord_graph

BATCH = 128
WARMUP = 4  # batches before the clock starts (the first one's time is its own column)
OBJECTS = 16
PAYLOAD = 3000
LATENCY = 0.02
READS = ObjectReads(cache_bytes=48 << 20)  # read-ahead "auto" (the default)
FEATURES = {"data": tf.io.FixedLenFeature((), tf.string)}


def parse(batch: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
    return tf.strings.length(tf.io.parse_example(batch, FEATURES)["data"])


def _urls(hand: PerRecord) -> list[str]:
    return sorted({url for url, _, _ in hand.spans})


def examples(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        data = rng.integers(0, 256, PAYLOAD, dtype=np.uint8).tobytes()
        feature = {"data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))}
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out


class PerRecord:
    """The hand-written source: one ranged s3fs GET per record (offsets given)."""

    def __init__(self, fs: Any, urls: list[str], offsets: list[np.ndarray], sizes: list[int]):
        self.fs, self.spans = fs, []
        for url, starts, size in zip(urls, offsets, sizes, strict=True):
            stops = np.append(starts[1:], size)
            self.spans += [(url, int(a), int(b)) for a, b in zip(starts, stops, strict=True)]

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, index: int) -> bytes:
        url, start, stop = self.spans[index]
        return self.fs.cat_file(url, start=start, end=stop)[12:-4]


class Run:
    """One contender's measurement: records/s and what it cost through the proxy."""

    def __init__(self, proxy: _objstore.RemoteProxy) -> None:
        self.proxy = proxy
        self._iterator: Any = None

    def _quiet(self, seconds: float = 0.3, limit: float = 10.0) -> None:
        """Waits until no GET has reached the proxy for `seconds` (at most `limit` s):
        the read-ahead of a contender measured before (its loader dropped, its GETs still
        in flight) must not count as this one's - it did: 17.5 "GETs per object per
        batch" for the unshuffled order run after the global shuffle, 1.000 alone."""
        deadline = time.monotonic() + limit
        last, since = self.proxy.reads, time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.proxy.reads
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= seconds:
                return

    def __call__(self, batches: Any, limit: int, warmup: int = WARMUP, *,
                 whole: bool = False) -> dict[str, float]:
        """Times `limit` batches after `warmup` batches; with `warmup` 0 from the start
        (the first batch included: for contenders whose every batch waits alike). With
        `whole` (a finite loader), the rest is read after the clock stops, and
        ``gets_whole`` is every GET of the run from its cold start (``batches_whole``
        batches): the timed window's GETs are those the proxy saw in it, read-ahead's for
        later batches included and the warm-up's for timed ones left out."""
        try:
            return self._measure(batches, limit, warmup, whole)
        finally:
            # Each contender's loader is closed before the next one is measured (its
            # producer, workers and read-ahead stop); then the proxy must fall quiet.
            # Left open, a dropped loader kept reading: the unshuffled order's "GETs
            # per object per batch" read 9.1-17.5 after the others, 1.000 alone.
            for part in (self._iterator, batches):
                close = getattr(part, "close", None)
                if close is not None:
                    close()
            self._iterator = None
            gc.collect()
            self._quiet()

    def _measure(self, batches: Any, limit: int, warmup: int,
                 whole: bool) -> dict[str, float]:
        self._quiet()
        fetch.clear()
        self.proxy.clear()
        warm = warmup
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        reads, sent = self.proxy.reads, self.proxy.bytes_sent
        cpu = _common.cpu_seconds()
        begin = time.perf_counter()
        batches = self._iterator = iter(batches)  # `for batch in loader`: its first batch here
        count = records = 0
        first = None
        start = asked = begin
        waits = []  # each measured batch's wait (the loop does nothing else)
        for batch in batches:
            got = time.perf_counter()
            if first is None:
                first = got - begin
            if count == 0 and warmup:
                warmup -= 1
                if not warmup:  # the clock starts after the warm-up batches
                    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    reads, sent = self.proxy.reads, self.proxy.bytes_sent
                    cpu = _common.cpu_seconds()
                    start = asked = time.perf_counter()
                continue
            waits.append(got - asked)
            records += int(np.shape(batch)[0])
            count += 1
            if count == limit:
                break
            asked = time.perf_counter()
        seconds = time.perf_counter() - start
        cpu = _common.cpu_seconds() - cpu
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        used = records * (PAYLOAD + 40)
        extra = {}
        if whole:
            read = warm - warmup + count + sum(1 for _ in batches)  # warm-up, timed, rest
            extra = {"gets_whole": float(self.proxy.reads), "batches_whole": float(read)}
        return {**extra,
            "rate": records / seconds, "cpu_us": cpu * 1e6 / records,
            "first": (first or 0.0) * 1e3,
            "gets": (self.proxy.reads - reads) / count,
            "amplification": (self.proxy.bytes_sent - sent) / used, "faults": faults / count,
            "p99": float(np.percentile(waits, 99)) * 1e3,
        }


def interleaved(cases: dict[str, Callable[[], dict[str, float]]], rounds: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for _ in range(rounds):
        for name, case in cases.items():
            samples[name].append(case())
            print(f"  {name}: {samples[name][-1]['rate']:,.1f} records/s", file=sys.stderr)
    return {
        name: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
        for name, runs in samples.items()
    }


def tf_data_on_s3(url: str) -> str:
    try:
        tf.io.gfile.glob(url)
    except Exception as err:  # TensorFlow's own filesystems
        return f"not available: {type(err).__name__}: {str(err).splitlines()[0][:80]}"
    return "available"


def restore_first_batch(store: dict[str, Any], num: int, rounds: int) -> tuple[float, float]:
    """ms (median) and GETs from a new source + loader + set_state at epoch 50 to batch 1."""
    key = f"big-{num}.tfrecord"
    data = _objstore.tfrecord_bytes([i.to_bytes(8, "little") for i in range(num)])
    store["put"](key, data)
    url, index_dir, proxy = store["url"](key), store["index_dir"], store["proxy"]

    def loader() -> ResumableLoader:
        source = TFRecordSource(url, index_dir=index_dir, storage=Storage(reads=READS))
        pipeline = Pipeline(source, seed=0).shuffle(block="4MiB").batch(BATCH)
        return ResumableLoader.from_pipeline(pipeline)

    state = dict(loader().get_state(), epoch=50, offset=num // 2 // BATCH * BATCH)  # index built
    times, gets = [], []
    for _ in range(rounds):
        fetch.clear()
        proxy.clear()
        start = time.perf_counter()
        fresh = loader()
        fresh.set_state(state)
        next(iter(fresh))
        times.append((time.perf_counter() - start) * 1e3)
        gets.append(proxy.reads)
    return statistics.median(times), statistics.median(gets)


def faults_table(pipeline: Callable[[], Pipeline], expected: list[bytes], proxy: Any) -> Table:
    table = Table(
        "faults", "One epoch in the block order under each fault kind", "bench_objstore.py",
        "Faults injected into every 7th object GET (8 per epoch), retried by `ObjectReads`; "
        "the epoch's records compared with the records written.",
        [Column("fault", "fault"), Column("injected", "injected", ",d"),
         Column("lost", "records lost", ",d"), Column("duplicated", "duplicated", ",d"),
         Column("partial", "partial records", ",d")],
    )
    load = _results.load_average()
    want = collections.Counter(expected)
    for kind in _objstore.FAULTS:
        fetch.clear()
        proxy.clear()
        proxy.inject(kind, 8, every=7, slow=2.0)
        loader = ResumableLoader.from_pipeline(pipeline(), num_epochs=1)
        got = collections.Counter(r for b in loader for r in b.numpy().tolist())
        table.add(
            fault=kind, injected=proxy.faulted[kind], lost=sum((want - got).values()),
            duplicated=sum((got - want).values()), partial=sum(1 for r in got if r not in want),
        )
    proxy.clear()
    return table.finish(load)


def array_record_table(written: list[bytes], folder: str, direct: Any, rounds: int) -> Table:
    """ArrayRecord objects read through local copies: building (downloads), then epochs."""
    from array_record.python import array_record_module

    per_object = len(written) // OBJECTS
    for part in range(OBJECTS):
        path = os.path.join(folder, f"ar-{part:02d}.array_record")
        writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
        for record in written[part * per_object : (part + 1) * per_object]:
            writer.write(record)
        writer.close()
        direct.put_file(path, f"bench/ar-{part:02d}.array_record")
    table = Table(
        "array_record", "ArrayRecord objects through local copies of whole objects",
        "bench_objstore.py",
        "The array-record reader opens local paths only, so objects are copied whole into a "
        "bounded local folder by version. Building the source with an empty folder downloads "
        "every object; epochs then read the copies (block order, chunks = objects).",
        [Column("name", "case"), Column("seconds", "seconds", ",.2f"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column()],
    )
    load = _results.load_average()
    s3, disk = "one epoch, s3:// (copies in the folder)", "one epoch, local disk"
    builds: list[tuple[float, float]] = []  # (seconds, CPU us per record)
    epochs: dict[str, list[tuple[float, float]]] = {s3: [], disk: []}  # (records/s, CPU us)
    local = ArrayRecordSource(os.path.join(folder, "ar-*.array_record"))
    for _ in range(rounds):
        copies = tempfile.mkdtemp(prefix="copies-", dir=folder)
        cpu, start = _common.cpu_seconds(), time.perf_counter()
        on_s3 = ArrayRecordSource(
            "s3://bench/ar-*.array_record", storage=Storage(cache_dir=copies)
        )
        builds.append((time.perf_counter() - start,
                       (_common.cpu_seconds() - cpu) * 1e6 / len(written)))
        for name, source in ((s3, on_s3), (disk, local)):
            pipeline = Pipeline(source, seed=0).shuffle(block="4MiB").batch(BATCH).tf_map(parse)
            cpu, start = _common.cpu_seconds(), time.perf_counter()
            loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
            count = sum(int(b.shape[0]) for b in loader)
            epochs[name].append((count / (time.perf_counter() - start),
                                 (_common.cpu_seconds() - cpu) * 1e6 / count))
    build = statistics.median(seconds for seconds, _ in builds)
    table.add(name="build the source, empty folder (downloads 16 objects)", seconds=build,
              rate=len(written) / build, cpu_us=statistics.median(c for _, c in builds))
    for name, samples in epochs.items():
        table.add(name=name, rate=statistics.median(r for r, _ in samples),
                  cpu_us=statistics.median(c for _, c in samples))
    return table.finish(load)


def build_table(count: int) -> Table:
    """Building a TFRecordSource over a glob of `count` small objects: seconds, CPU seconds
    (this process) and requests per object, without and with sidecar indexes."""
    from resumeloader import cli

    table = Table(
        "build", f"Building a source over {count:,} small TFRecord objects", "bench_objstore.py",
        "TFRecordSource over one glob of objects of 2 records (about 100 bytes) in moto's "
        "S3 server (a process of its own, no added latency), an empty index folder; timed "
        "against the server itself, then built again through the counting proxy for the "
        "requests (listings included).",
        [Column("name", "case"), Column("seconds", "seconds", ",.1f"),
         Column("cpu", "CPU seconds", ",.1f"), Column("per_object", "requests/object", ".3f"),
         Column("lists", "listings", ",d")],
    )
    load = _results.load_average()
    with _objstore.s3_process(0.0) as (endpoint, proxy):
        import s3fs

        direct = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        direct.call_s3("create_bucket", Bucket="many")
        data = {
            f"many/part-{i:05d}.tfrecord": _objstore.tfrecord_bytes([b"%d" % i, b"x" * 40])
            for i in range(count)
        }
        direct.pipe(data)

        def build(via: str) -> float:
            """Seconds to build the source with empty index and cache folders."""
            folder = tempfile.mkdtemp(prefix="bench-build-")
            fetch.clear()
            options = {"endpoint_url": via, "key": "testing", "secret": "testing",
                       "client_kwargs": {"region_name": "us-east-1"}}
            try:
                start = time.perf_counter()
                source = TFRecordSource(
                    "s3://many/part-*.tfrecord", index_dir=os.path.join(folder, "index"),
                    storage=Storage(options=options, cache_dir=folder),
                )
                seconds = time.perf_counter() - start
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            assert len(source) == 2 * count
            return seconds

        for name, sidecars in (("no sidecars: each object read once", False),
                               ("sidecars: each sidecar read once", True)):
            if sidecars:
                saved = dict(os.environ)
                os.environ.update(_objstore.s3_environment(endpoint))
                try:
                    with contextlib.redirect_stdout(io.StringIO()):  # a line per object
                        cli.main(["index", "s3://many/part-*.tfrecord"])
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
            cpu = time.process_time()
            seconds = build(endpoint)
            cpu = time.process_time() - cpu
            proxy.clear()
            build(proxy.url)
            requests = proxy.requests
            table.add(name=name, seconds=seconds, cpu=cpu,
                      per_object=sum(requests.values()) / count, lists=requests.get("list", 0))
    return table.finish(load)


def run(quick: bool, rounds: int) -> Report:
    num = 4_000 if quick else 20_000
    per_object = num // OBJECTS
    folder = tempfile.mkdtemp(prefix="bench-objstore-")
    with _objstore.s3_process(LATENCY) as (endpoint, proxy):
        import psutil
        import s3fs

        # The S3 server and its proxy stand for the remote store: not the loader's CPU.
        _common.not_counted(p.pid for p in psutil.Process().children())

        os.environ.update(_objstore.s3_environment(proxy.url))
        direct = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        direct.call_s3("create_bucket", Bucket="bench")
        written = _put_objects(direct, folder, per_object)
        url = "s3://bench/train-*.tfrecord"
        index_dir = os.path.join(folder, "index")
        on_s3 = TFRecordSource(url, index_dir=index_dir, storage=Storage(reads=READS))
        local = TFRecordSource(os.path.join(folder, "train-*.tfrecord"), index_dir=index_dir)
        wide = TFRecordSource(url, index_dir=index_dir, storage=Storage(reads=ObjectReads(
            cache_bytes=48 << 20, gap_bytes=64 << 10)))
        fs = s3fs.S3FileSystem(skip_instance_cache=True)  # the endpoint from AWS_ENDPOINT_URL
        paths = [os.path.join(folder, f"train-{part:02d}.tfrecord") for part in range(OBJECTS)]
        hand = PerRecord(
            fs, [f"s3://bench/{os.path.basename(path)}" for path in paths],
            [tfrecord_index.build(path) for path in paths], [os.path.getsize(p) for p in paths],
        )
        measure = Run(proxy)

        def loader(pipeline: Pipeline, **kwargs: Any) -> Any:
            return ResumableLoader.from_pipeline(pipeline.batch(BATCH).tf_map(parse), **kwargs)

        def generated(pipeline: Pipeline) -> Any:
            """`loader(pipeline)` on the ``read_batch`` path (batches made in Python,
            through ``from_generator``: what s3:// took before its windows were spooled),
            not the ``tfrecord_graph`` path the block order takes."""
            every = delivery_paths.PATHS
            delivery_paths.PATHS = tuple(
                p for p in every if p is not tfrecord_graph.TFRecordGraphPath)
            try:
                made = loader(pipeline)
            finally:
                delivery_paths.PATHS = every
            assert made._delivery.name == "read_batch", made._delivery.name
            return made

        epoch = num // BATCH - WARMUP
        few = 4 if quick else 8
        # Quick: 1 MiB chunks, so that its 4,000 records still make 4 windows (read ahead).
        block = "1MiB" if quick else "4MiB"
        names = {
            "block": "TFRecordSource + tf_map, block order, s3:// (+20 ms)",
            "local": "TFRecordSource + tf_map, block order, local disk",
            "s3_gen": "same, s3://, read_batch path (before the spool)",
            "local_gen": "same, local disk, read_batch path",
            "global": "TFRecordSource + tf_map, global shuffle, s3:// (+20 ms)",
            "global64": "global shuffle, s3://, ObjectReads(gap_bytes=64 KiB)",
            "order": "TFRecordSource + tf_map, unshuffled, s3:// (+20 ms)",
            "hand": "hand-written fsspec __getitem__ (1 GET per record), s3://",
            "hand8": "hand-written fsspec __getitem__, 8 thread workers, s3://",
            "reference": "reference: every object read whole, 16 GETs at once",
            "server": "bound: the objects' bytes received by 16 plain GETs, no records",
        }
        cases = {
            "block": lambda: measure(loader(Pipeline(on_s3, seed=0).shuffle(block=block)), epoch),
            "local": lambda: measure(loader(Pipeline(local, seed=0).shuffle(block=block)), epoch),
            "s3_gen": lambda: measure(
                generated(Pipeline(on_s3, seed=0).shuffle(block=block)), epoch),
            "local_gen": lambda: measure(
                generated(Pipeline(local, seed=0).shuffle(block=block)), epoch),
            "global": lambda: measure(
                loader(Pipeline(on_s3, seed=0).shuffle()), few, warmup=1),
            "global64": lambda: measure(
                loader(Pipeline(wide, seed=0).shuffle()), few, warmup=1),
            "order": lambda: measure(loader(Pipeline(on_s3, seed=0), num_epochs=1), epoch,
                                     whole=True),
            "hand": lambda: measure(
                loader(Pipeline(IndexableSource(hand), seed=0).shuffle()), 1, warmup=0),
            "hand8": lambda: measure(loader(Pipeline(IndexableSource(hand), seed=0).shuffle(),
                                            workers=Workers(8, kind="thread")), few * 2,
                                    warmup=0),
            "reference": lambda: measure(_reference(fs, hand), num // BATCH, warmup=0),
            "server": lambda: measure(_server_bound(fs, hand), -(-num // BATCH), warmup=0),
        }
        load = _results.load_average()
        results = interleaved(cases, rounds)
        table = Table(
            "objstore", f"{num:,} TFRecord records of 3 KB in {OBJECTS} S3 objects, +20 ms per "
            "request", "bench_objstore.py",
            "Batch 128, tf_map(parse_example); medians of interleaved rounds; the S3 readers "
            f"keep at most 48 MiB of the {len(written) * (PAYLOAD + 40) / 1e6:.0f} MB in cache; "
            f"block order: {block} chunks, 4 per window; "
            f"{WARMUP} warm-up batches. tf.data on the same URL: "
            f"{tf_data_on_s3(url)}.",
            [Column("name", "pipeline"), Column("rate", "records/s", ",.0f"),
             _results.cpu_column(), Column("ratio", "vs block order", ".2f", "x"),
             Column("first", "first batch", ",.0f", " ms"),
             Column("p99", "p99 wait", ",.1f", " ms"), Column("gets", "GETs/batch", ".2f"),
             Column("amplification", "bytes read / used", ".2f"),
             Column("faults", "minor faults/batch", ",.0f")],
        )
        for key, name in names.items():
            row = results[key]
            table.add(name=name, rate=row["rate"], cpu_us=row["cpu_us"],
                      ratio=row["rate"] / results["block"]["rate"],
                      first=row["first"], p99=row["p99"], gets=row["gets"],
                      amplification=row["amplification"],
                      faults=row["faults"])
        table.finish(load)
        store = {"put": lambda k, d: direct.pipe_file(f"bench/{k}", d),
                 "url": lambda k: f"s3://bench/{k}", "index_dir": index_dir, "proxy": proxy}
        load = _results.load_average()
        first_ms, first_gets = restore_first_batch(store, 100_000 if quick else 1_000_000,
                                                   3 if quick else 5)
        restore = Table(
            "restore", "Restore to the first batch at epoch 50 (index cached)", "bench_objstore.py",
            "A new TFRecordSource and loader of one S3 object, set_state at epoch 50 "
            "mid-epoch, the first batch of `for batch in loader` (block order); median.",
            [Column("records", "records", ",d"), Column("ms", "ms", ",.0f"),
             Column("gets", "GETs (listing excluded)", ",.0f")],
        )
        restore.add(records=100_000 if quick else 1_000_000, ms=first_ms, gets=first_gets)
        restore.finish(load)
        array_records = array_record_table(written, folder, direct, rounds)
        faults = faults_table(
            lambda: Pipeline(TFRecordSource(url, index_dir=index_dir, storage=Storage(
                reads=ObjectReads(backoff=0.01, timeout=1.0, cache_bytes=48 << 20))), seed=1)
            .shuffle(block="1MiB").batch(BATCH), written, proxy)
    block, by = results["block"]["rate"], results
    item = "30.4, object storage"
    targets = [
        Target("block order over S3 (+20 ms) / same on local disk, CPU per record",
               by["local"]["cpu_us"] / by["block"]["cpu_us"], 0.9, item=item),
        Target("block order over S3 (+20 ms) / same on local disk, wall (idle)",
               block / by["local"]["rate"], 0.8, item=item),
        Target("block order: p99 consumer wait, S3 / local disk",
               by["block"]["p99"] / by["local"]["p99"], 2.0, at_most=True, item=item),
        Target("block order over S3 / hand-written per-record source", block / by["hand"]["rate"],
               20, item="21", cpu_value=by["hand"]["cpu_us"] / by["block"]["cpu_us"]),
        Target("unshuffled: GETs per object per batch",
               _gets_per_object_batch(by["order"], per_object, num), 1.0, unit="",
               at_most=True, item="21"),
        Target("restore -> first batch, epoch 50, index cached", first_ms, 250, unit=" ms",
               at_most=True, item="21"),
        Target("records lost + duplicated + partial under every fault kind",
               float(sum(r["lost"] + r["duplicated"] + r["partial"] for r in faults.rows)), 0,
               unit="", at_most=True, item="21"),
    ]
    build = build_table(1_000 if quick else 10_000)
    return Report([table, restore, array_records, faults, build], targets + build_targets(build))


def _put_objects(direct: Any, folder: str, per_object: int) -> list[bytes]:
    """Writes the `OBJECTS` TFRecord objects to the bucket and to `folder`; their records."""
    written = []
    for part in range(OBJECTS):
        records = examples(per_object, part)
        written += records
        data = _objstore.tfrecord_bytes(records)
        with open(os.path.join(folder, f"train-{part:02d}.tfrecord"), "wb") as f:
            f.write(data)
        direct.pipe_file(f"bench/train-{part:02d}.tfrecord", data)
    return written


def unshuffled_only(quick: bool, rounds: int) -> None:
    """Only the unshuffled contender and its GETs target (``--unshuffled-only``), printed."""
    import s3fs

    num = 4_000 if quick else 20_000
    per_object = num // OBJECTS
    folder = tempfile.mkdtemp(prefix="bench-objstore-")
    with _objstore.s3_process(LATENCY) as (endpoint, proxy):
        os.environ.update(_objstore.s3_environment(proxy.url))
        direct = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing")
        direct.call_s3("create_bucket", Bucket="bench")
        _put_objects(direct, folder, per_object)
        source = TFRecordSource("s3://bench/train-*.tfrecord", storage=Storage(reads=READS),
                                index_dir=os.path.join(folder, "index"))
        for _ in range(rounds):
            loader = ResumableLoader.from_pipeline(
                Pipeline(source, seed=0).batch(BATCH).tf_map(parse), num_epochs=1)
            row = Run(proxy)(loader, num // BATCH - WARMUP, whole=True)
            print(f"records/s {row['rate']:,.0f}, CPU {row['cpu_us']:.1f} us/record, "
                  f"GETs/batch (timed window) {row['gets']:.3f}, GETs per object per batch "
                  f"(whole epoch) {_gets_per_object_batch(row, per_object, num):.3f}: "
                  f"{row['gets_whole']:.0f} GETs, {row['batches_whole']:.0f} batches "
                  f"touching {_objects_touched(per_object, num, int(row['batches_whole']))} "
                  "objects in all")
    shutil.rmtree(folder, ignore_errors=True)


def build_targets(build: Table) -> list[Target]:
    """The build table's targets: 10,000 objects in 60 s, 1.05 requests per object."""
    cold = {row["name"]: row for row in build.rows}["no sidecars: each object read once"]
    return [
        Target(f"build over {build.title.split()[4]} small objects, no sidecars",
               cold["seconds"], 60, unit=" s", at_most=True, item="29.4"),
        Target("build: requests per object (listings included)", cold["per_object"], 1.05,
               unit="", at_most=True, item="29.4"),
    ]


def _objects_touched(per_object: int, num: int, batches: int) -> int:
    """The objects the first `batches` batches of `num` records in storage order touch,
    added up over the batches (an object two batches touch counts twice)."""
    return sum(len({k // per_object for k in range(b * BATCH, min(num, (b + 1) * BATCH))})
               for b in range(batches))


def _gets_per_object_batch(row: dict[str, float], per_object: int, num: int) -> float:
    """GETs per object a batch touches, over a whole epoch read in storage order from a
    cold cache (`Run` with `whole`): every GET of the run, over the objects its batches
    touch. The timed window's GETs would count read-ahead's for batches after it (the
    next ones, up to its budget) and leave out the warm-up's for timed ones."""
    return row["gets_whole"] / _objects_touched(per_object, num, int(row["batches_whole"]))


def _reference(fs: Any, hand: PerRecord) -> Any:
    """Every object read whole at once (16 GETs), then cut into batches of records."""
    data = {f"s3://{key}": value for key, value in fs.cat(_urls(hand)).items()}
    records = [data[url][a + 12 : b - 4] for url, a, b in hand.spans]
    for start in range(0, len(records), BATCH):
        yield records[start : start + BATCH]


def _server_bound(fs: Any, hand: PerRecord) -> Any:
    """Every object's bytes received whole by plain GETs (urllib3, presigned URLs, 16 at
    once), each into memory allocated and touched before the clock, no records cut: what
    the server and its proxy deliver (records/s) and what receiving alone costs a client
    (CPU), the bound of any reader of these objects. Yields placeholder batches of the
    records' count once every body is in."""
    import concurrent.futures

    import urllib3

    urls = _urls(hand)
    sizes = [int(fs.size(url)) for url in urls]
    signed = [fs.url(url, expires=3600) for url in urls]
    into = [np.ones(size, np.uint8) for size in sizes]  # its pages touched: no faults timed
    pool = urllib3.PoolManager(maxsize=len(urls))

    def receive(url: str, out: np.ndarray) -> int:
        answer = pool.request("GET", url, preload_content=False, decode_content=False)
        view, got = out.data, 0
        readinto = answer._fp.readinto  # the http.client response: straight into place
        while got < len(out):
            n = readinto(view[got : got + (1 << 20)])
            if not n:
                break
            got += n
        answer.release_conn()
        if got != len(out) or answer.status != 200:
            raise OSError(f"GET {url}: {answer.status}, {got} of {len(out)} bytes")
        return got

    def batches() -> Any:
        with concurrent.futures.ThreadPoolExecutor(len(urls)) as threads:
            list(threads.map(receive, signed, into))
        for start in range(0, len(hand), BATCH):
            yield np.empty(min(BATCH, len(hand) - start))

    return batches()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,000 records, 1 round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--build-only", type=int, metavar="OBJECTS", default=0,
        help="only the build table, over this many objects",
    )
    parser.add_argument("--unshuffled-only", action="store_true",
                        help="only the unshuffled contender's GETs, printed")
    _common.add_json_option(parser)
    args = parser.parse_args()
    timer = _results.Timer(_results.command_line(), args.quick)
    if args.unshuffled_only:
        unshuffled_only(args.quick, 1 if args.quick else args.rounds)
        return
    if args.build_only:  # printed only: the results file keeps the full run's tables
        build = build_table(args.build_only)
        print(Report([build], []).markdown)
        print()
        print(_results.targets_table(build_targets(build)))
        return
    _common.finish(run(args.quick, 1 if args.quick else args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
