"""``resumeloader plan``: its figures against counted runs of the same loader, its output.

The reads are counted where they happen: object GETs and their bytes by the fault proxy
in front of moto's S3 server (`_objstore.FaultProxy`), local reads by the storage
layer's own counter (`handles.stats`). The plan runs first, in this process, through
the command line (``--json``); then the loader the same factory builds is run over the
same steps from a cold cache, and the counts must be what the plan said, exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import _limits
import pytest
from _objstore_fixtures import put_tfrecords

from resumeloader import cli
from resumeloader.sources.storage import fetch, handles
from resumeloader.tools import factory

_JOB = '''
import json
from resumeloader import Pipeline, ResumableLoader
from resumeloader.sources import ObjectReads, Storage, TFRecordSource

def make():
    reads = ObjectReads(**json.loads({reads!r}))
    source = TFRecordSource({url!r}, index_dir={index!r},
                            storage=Storage(options=json.loads({options!r}), reads=reads))
    pipeline = Pipeline(source, seed=7){order}.batch({batch})
    return ResumableLoader.from_pipeline(pipeline, num_epochs={epochs}, prefetch={prefetch})
'''

_ORDERS = {
    "blocks": ".shuffle(chunk_records=20, window_chunks=3)",
    # A window of 12 chunks of 5 records: a batch of 16 leaves a few of its blocks unused,
    # which a cache smaller than the window drops (the blocks a read uses it keeps).
    "small-blocks": ".shuffle(chunk_records=5, window_chunks=12)",
    "global": ".shuffle()",
    "natural": ".shuffle(False)",
}


def _job(tmp_path, url, *, order, reads=None, options=None, batch=16, epochs=2, prefetch=None):
    """A factory file building the loader; its ``MODULE:FACTORY`` spec."""
    path = tmp_path / f"planjob_{order}.py"
    path.write_text(_JOB.format(
        reads=json.dumps(reads or {}), url=url, index=str(tmp_path / "index"),
        options=json.dumps(options or {}), order=_ORDERS[order], batch=batch, epochs=epochs,
        prefetch=prefetch,
    ))
    return f"{path}:make"


def _plan(spec, capsys, *args):
    """The plan's JSON lines for `spec`, by kind."""
    capsys.readouterr()
    assert cli.main(["plan", spec, "--json", *args]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    out: dict[str, list[dict]] = {}
    for line in lines:
        out.setdefault(line["kind"], []).append(line)
    return out


def _run(spec, steps, *, start=0, proxy=None):
    """Runs the factory's loader over `steps` batches from step `start`, from a cold cache
    (and a cleared `proxy`); the number of batches."""
    loader = factory.build(spec).loader
    if start:
        position = loader.plan.layout.advance(0, start)
        epoch, offset = divmod(position, loader.plan.records_per_epoch)
        loader.set_state(dict(loader.get_state(), epoch=epoch, offset=offset))
    fetch.clear()
    if proxy is not None:
        proxy.clear()
    before = handles.stats()
    done = 0
    for _ in loader:
        done += 1
        if done == steps:
            break
    after = handles.stats()
    return done, after["reads"] - before["reads"], after["bytes"] - before["bytes"]


@pytest.mark.parametrize(
    ("order", "reads"),
    [
        ("blocks", {}),
        ("global", {}),
        ("global", {"gap_bytes": 2048}),
        ("global", {"gap_bytes": 0, "cache_bytes": 40_000, "readahead_bytes": 0}),
        ("small-blocks", {"cache_bytes": 40_000, "readahead_bytes": 0}),
        ("small-blocks", {"cache_bytes": 400_000, "readahead_bytes": 0}),
        ("small-blocks", {}),
        ("natural", {"gap_bytes": 0}),
    ],
    ids=["block-order", "global-shuffle", "global-small-gaps", "global-cache-too-small",
         "blocks-cache-too-small", "small-blocks-large-cache", "small-blocks",
         "natural-order"],
)
def test_plan_gets_and_bytes_equal_a_counted_run_over_s3(s3_store, tmp_path, capsys, order,
                                                         reads):
    """The GETs and bytes the plan predicts for two whole epochs are those the proxy counts."""
    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    spec = _job(tmp_path, url, order=order, reads=reads, options=s3_store.options)
    total = _plan(spec, capsys, "--steps", "0:24")["total"][0]
    assert _run(spec, 24, proxy=s3_store.proxy)[0] == 24
    assert (total["gets"], total["get_bytes"]) == (s3_store.proxy.reads,
                                                   s3_store.proxy.bytes_sent)
    assert total["records"] == 360 and total["gets"] > 0
    if "cache_bytes" in reads and order == "small-blocks":  # the plan says that it is too
        # small (GETs merged across held blocks keep two copies of them: more than the data)
        assert total["reread_bytes"] > 0 and total["cache_bytes"] > reads["cache_bytes"]
    elif "cache_bytes" in reads:  # a global order reads each record once an epoch: the
        # second epoch's GETs read again all that the cache does not hold, but no span
        # is read twice within an epoch
        assert total["get_bytes"] >= total["record_bytes"] - reads["cache_bytes"]
        assert (total["reread_bytes"], total["cache_bytes"]) == (0, 0)


def test_plan_cache_need_suffices_in_a_counted_run(s3_store, tmp_path, capsys):
    """With the cache_bytes the plan asks for, the plan says that no span is read twice
    in an epoch, and the counted run reads what it says."""
    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    reads = {"cache_bytes": 40_000, "readahead_bytes": 0}
    small = _plan(_job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options),
                  capsys, "--steps", "0:12")["total"][0]
    assert small["cache_bytes"] > reads["cache_bytes"]
    reads["cache_bytes"] = small["cache_bytes"]
    spec = _job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options)
    enough = _plan(spec, capsys, "--steps", "0:12")["total"][0]
    assert enough["reread_bytes"] == 0 < small["reread_bytes"]
    assert enough["get_bytes"] < small["get_bytes"]
    assert _run(spec, 12, proxy=s3_store.proxy)[0] == 12
    assert (enough["gets"], enough["get_bytes"]) == (s3_store.proxy.reads,
                                                     s3_store.proxy.bytes_sent)


def test_cache_need_counts_reuse_within_an_epoch_only():
    """Reuse distance and re-read bytes count a span's reuse in the epoch that last used
    it; the first use in a later epoch counts neither (its GET shows in the GETs)."""
    from resumeloader.sources.storage import objects
    from resumeloader.tools import cache_need

    obj = objects.Object("s3://b/k", 300, "v1")
    a, b = (obj, 0, 100), (obj, 100, 200)
    need = cache_need.CacheNeed(10_000)
    dropped = lambda *_: False  # noqa: E731  (the cache kept nothing)
    steps = [(0, a), (0, b), (0, a), (1, b), (1, a), (1, b)]
    found = [need.step(k, epoch, [span], [span], dropped) for k, (epoch, span) in
             enumerate(steps)]
    assert found == [(0, 0), (0, 0), (200, 100), (0, 0), (0, 0), (200, 100)]
    assert (need.need, need.reread) == (200, 200)
    kept = lambda *_: True  # noqa: E731  (a GET merged across a span the cache holds)
    assert need.step(6, 1, [a], [a], kept) == (200, 0)


def test_plan_of_steps_mid_run_equals_a_restored_run(s3_store, tmp_path, capsys):
    """Steps 7:15 of a block order, planned, cost what a run restored at step 7 reads."""
    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    spec = _job(tmp_path, url, order="blocks", reads={"readahead_bytes": 0},
                options=s3_store.options, prefetch=0)
    rows = _plan(spec, capsys, "--steps", "7:15", "--every", "4")
    assert [(r["first_step"], r["stop_step"]) for r in rows["row"]] == [(7, 11), (11, 15)]
    assert _run(spec, 8, start=7, proxy=s3_store.proxy)[0] == 8
    total = rows["total"][0]
    assert (total["gets"], total["get_bytes"]) == (s3_store.proxy.reads,
                                                   s3_store.proxy.bytes_sent)


@pytest.mark.parametrize("order", ["blocks", "global"])
def test_plan_preads_and_bytes_equal_a_counted_run_on_local_files(tmp_path, capsys, order):
    """On local files the plan predicts the storage layer's preads and bytes exactly."""
    from _objstore import tfrecord_bytes
    from _objstore_fixtures import records

    for file in range(3):
        (tmp_path / f"part-{file}.tfrecord").write_bytes(tfrecord_bytes(records(file, 60, 2000)))
    spec = _job(tmp_path, str(tmp_path / "part-*.tfrecord"), order=order)
    total = _plan(spec, capsys, "--steps", "0:24")["total"][0]
    assert _run(spec, 24) == (24, total["preads"], total["pread_bytes"])
    assert total["gets"] == 0 and total["preads"] > 0


def test_plan_prints_a_table_with_the_shuffle_scores(s3_store, tmp_path, capsys):
    """Without --json: the reads table, the cache advice and both shuffle scores."""
    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    spec = _job(tmp_path, url, order="blocks", options=s3_store.options)
    assert cli.main(["plan", spec, "--steps", "0:10", "--buffer", "64"]) == 0
    out = capsys.readouterr().out
    assert "reads of steps 0:10" in out and "GET" in out
    assert url.replace("*", "0") in out  # not a terminal: full names
    assert "No byte is read twice in an epoch." in out
    assert "BlockOrder" in out and "shuffle(64)" in out and "ideal" in out


def test_plan_of_a_pipeline_factory_imports_no_tensorflow(tmp_path):
    """A factory returning a Pipeline is planned without TensorFlow in the process."""
    job = tmp_path / "pipe.py"
    job.write_text(textwrap.dedent("""
        import numpy as np
        from resumeloader import Pipeline

        def make():
            return Pipeline(np.arange(1000), seed=0).shuffle(chunk_records=50).batch(10)
    """))
    code = (
        "import sys\nfrom resumeloader import cli\n"
        f"status = cli.main(['plan', {str(job) + ':make'!r}, '--steps', '0:20', '--json'])\n"
        "print('tensorflow' in sys.modules, status)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=_limits.PROCESS)
    assert result.stdout.strip().splitlines()[-1] == "False 0", result.stderr
    kinds = [json.loads(line)["kind"] for line in result.stdout.splitlines()[:-1]]
    assert kinds.count("row") == 10 and kinds.count("shuffle") == 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--steps", "5:2"], "--steps must be N or START:STOP"),
        (["--shards", "3"], "--shards must be 'all' or shard indices in [0, 1)"),
        (["--every", "0"], "--every must be a positive number of steps"),
    ],
    ids=["empty-steps", "bad-shard", "bad-every"],
)
def test_plan_bad_arguments_exit_2(tmp_path, capsys, argv, expected):
    """Usage errors exit with status 2 and one line naming the argument."""
    job = tmp_path / "pipe_args.py"
    job.write_text("import numpy as np\nfrom resumeloader import Pipeline\n\n"
                   "def make():\n    return Pipeline(np.arange(100), seed=0).batch(10)\n")
    assert cli.main(["plan", f"{job}:make", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_plan_of_a_packing_stage_refuses_steps(tmp_path, capsys):
    """Steps of a stage whose batches hold what the data lets them cannot be planned."""
    job = tmp_path / "pack.py"
    job.write_text(textwrap.dedent("""
        import numpy as np
        from resumeloader import Pipeline

        def make():
            data = [np.arange(n % 7 + 1) for n in range(200)]
            return Pipeline(data, seed=0).pack(16, window=32, batch_size=2)
    """))
    assert cli.main(["plan", f"{job}:make", "--steps", "0:4"]) == 2
    assert "Steps cannot be planned for this loader without reading its data" in (
        capsys.readouterr().err
    )


def test_plan_reads_each_task_once_for_both_caches(s3_store, tmp_path, capsys, monkeypatch):
    """The source's dry read runs once per task: the cache need's cache (`DryRun.shadow`)
    records the same reads, and the figures still equal a counted run."""
    from resumeloader.sources import TFRecordSource

    calls = []
    real = TFRecordSource.dry_read

    def counted(self, indices, dry):
        calls.append(len(indices))
        return real(self, indices, dry)

    monkeypatch.setattr(TFRecordSource, "dry_read", counted)
    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    reads = {"cache_bytes": 40_000, "readahead_bytes": 0}
    spec = _job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options)
    total = _plan(spec, capsys, "--steps", "0:12")["total"][0]
    assert calls == [16] * 11 + [4]  # one call per batch: 12 steps, an epoch of 180 records
    assert total["cache_bytes"] > reads["cache_bytes"] and not total["cache_beyond"]
    assert _run(spec, 12, proxy=s3_store.proxy)[0] == 12
    assert (total["gets"], total["get_bytes"]) == (s3_store.proxy.reads,
                                                   s3_store.proxy.bytes_sent)


def test_plan_says_when_the_cache_need_exceeds_what_it_follows(s3_store, tmp_path, capsys,
                                                                 monkeypatch):
    """A need larger than the cache the plan follows (4x cache_bytes, at least
    `NEED_BYTES`) is not measured but said, in the rows and in the advice; planning
    again with that cache_bytes measures it."""
    from resumeloader.tools import plan_reads

    url, _ = put_tfrecords(s3_store, files=3, count=60, size=2000)
    reads = {"cache_bytes": 40_000, "readahead_bytes": 0}
    spec = _job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options)
    need = _plan(spec, capsys, "--steps", "0:12")["total"][0]["cache_bytes"]
    monkeypatch.setattr(plan_reads, "NEED_BYTES", 1)
    reads["cache_bytes"] = need // 8  # the plan follows 4x that: half the need
    spec = _job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options)
    out = _plan(spec, capsys, "--steps", "0:12")
    total = out["total"][0]
    assert total["cache_beyond"] and total["cache_followed"] == 4 * reads["cache_bytes"]
    assert any(row["cache_beyond"] for row in out["row"])
    assert total["cache_bytes"] <= total["cache_followed"] < need
    capsys.readouterr()
    assert cli.main(["plan", spec, "--steps", "0:12"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"needs cache_bytes > {4 * reads['cache_bytes'] / 1024:.1f} KiB" in text
    reads["cache_bytes"] = 4 * reads["cache_bytes"]  # as the advice says: follows 2x the need
    spec = _job(tmp_path, url, order="small-blocks", reads=reads, options=s3_store.options)
    again = _plan(spec, capsys, "--steps", "0:12")["total"][0]
    assert (again["cache_beyond"], again["cache_bytes"]) == (False, need)


def test_cache_need_notices_a_reuse_farther_than_it_follows():
    """A span forgotten past `limit` and read again in its epoch counts as `beyond` (the
    need is larger than `limit`); one forgotten in an earlier epoch does not."""
    from resumeloader.sources.storage import objects
    from resumeloader.tools import cache_need

    obj = objects.Object("s3://b/k", 300, "v1")
    a, b = (obj, 0, 100), (obj, 100, 200)
    dropped = lambda *_: False  # noqa: E731
    need = cache_need.CacheNeed(150)  # holds one span: a is forgotten when b is read
    for k, span in enumerate([a, b, a]):
        need.step(k, 0, [span], [span], dropped)
    assert (need.beyond, need.need, need.forgot) == (100, 0, 2)
    need = cache_need.CacheNeed(150)
    for k, (epoch, span) in enumerate([(0, a), (0, b), (1, a)]):
        need.step(k, epoch, [span], [span], dropped)
    assert need.beyond == 0
