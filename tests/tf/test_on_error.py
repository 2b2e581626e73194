"""The bad-record policy (`Pipeline.on_error`): raise, skip, a callable; the quarantine
log and the error budget."""

from __future__ import annotations

import json
import os
import tempfile

import _worker_fns as fns
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import (
    ErrorBudgetError,
    Pipeline,
    RecordError,
    RecordSpecError,
    ResumableLoader,
    Shard,
    StateMismatchError,
    StreamIntegrityError,
    Workers,
)
from resumeloader.stages import on_error

_NUM = 30


def _pipeline(bad, *, seed=0, batched=False, map_fn=None, num_records=_NUM) -> Pipeline:
    source = fns.BadRecordSource(num_records, bad, batched=batched)
    pipeline = Pipeline(source, seed=seed).shuffle()
    return pipeline if map_fn is None else pipeline.map(map_fn)


def _loader(log, bad, policy="skip", *, max_fraction=1.0, batch_size=4, seed=0, batched=False,
            map_fn=None, num_epochs=2, **kwargs) -> ResumableLoader:
    pipeline = _pipeline(bad, seed=seed, batched=batched, map_fn=map_fn)
    pipeline = pipeline.on_error(policy, max_fraction=max_fraction, quarantine=log)
    return ResumableLoader.from_pipeline(
        pipeline.batch(batch_size), num_epochs=num_epochs, **kwargs
    )


def _drain(loader) -> list[np.ndarray]:
    return [batch.numpy() for batch in loader]


def _lines(log) -> list[dict]:
    if not os.path.exists(log):  # created at the first replacement
        return []
    with open(log) as file:
        return [json.loads(line) for line in file]


def _positions(loader, index: int, epoch: int = 0) -> int:
    """Where record `index` sits in `epoch` of the loader's (shard's) order."""
    per_epoch = loader.plan.records_per_epoch
    order = loader.plan.indices(epoch, 0, per_epoch).tolist()
    return epoch * per_epoch + order.index(index)


# -- raise (the default) -------------------------------------------------------------


@pytest.mark.parametrize("explicit", [False, True], ids=["default", "on_error-raise"])
def test_raise_policy_failing_record_ends_stream_with_record_error(explicit, tmp_path):
    """Without a policy, or with "raise", a failing record raises RecordError naming it."""
    pipeline = _pipeline({7})
    if explicit:
        pipeline = pipeline.on_error("raise")
    loader = ResumableLoader.from_pipeline(pipeline.batch(4), num_epochs=1)

    with pytest.raises(RecordError) as info:
        _drain(loader)

    position = _positions(loader, 7)
    assert (info.value.record_index, info.value.epoch, info.value.position) == (7, 0, position)
    assert isinstance(info.value.__cause__, ValueError)
    assert not list(tmp_path.iterdir())


def test_raise_policy_adds_no_order_field():
    """The default policy leaves the order fields (and so every saved state) unchanged."""
    fields = Pipeline(np.arange(5), seed=0).on_error("raise").order_fields()

    assert fields == Pipeline(np.arange(5), seed=0).order_fields()


# -- skip --------------------------------------------------------------------------------


def test_skip_failing_records_replaced_batch_shapes_unchanged(tmp_path):
    """Every batch keeps its size; no failing record appears; replacements come from the data."""
    bad = {3, 7, 8}
    loader = _loader(tmp_path / "q.jsonl", bad)
    clean = _drain(ResumableLoader.from_pipeline(_pipeline(set()).batch(4), num_epochs=2))

    stream = _drain(loader)

    assert [len(b) for b in stream] == [len(b) for b in clean]
    ids = np.concatenate(stream)[:, 0].tolist()
    assert not set(ids) & bad
    assert set(ids) <= set(range(_NUM))
    np.testing.assert_array_equal(np.concatenate(stream)[:, 1], np.concatenate(stream)[:, 0] * 10)
    planned = np.concatenate(clean)[:, 0].tolist()
    # Every record that does not fail stays where it was.
    assert [i for i, c in zip(ids, planned, strict=True) if c not in bad] == [
        c for c in planned if c not in bad
    ]


def test_skip_quarantine_log_names_each_replacement(tmp_path):
    """One line per replacement: epoch, position, record index, replacement, error, shard."""
    log = tmp_path / "q.jsonl"
    loader = _loader(log, {7}, with_metadata=True)

    stream = [(b.numpy(), m["index"].numpy()) for b, m in loader]

    lines = _lines(log)
    assert [(line["epoch"], line["position"]) for line in lines] == [
        (0, _positions(loader, 7, 0)), (1, _positions(loader, 7, 1))
    ]
    first = lines[0]
    batch, offset = divmod(first["position"], 4)
    assert stream[batch][0][offset, 0] == first["replacement"]
    assert stream[batch][1][offset] == first["replacement"]  # metadata names it too
    assert {k: first[k] for k in ("record_index", "policy", "error", "message")} == {
        "record_index": 7, "policy": "skip", "error": "ValueError",
        "message": "record 7 is corrupt",
    }
    assert (first["shard_index"], first["shard_count"]) == (0, 1)
    assert first["fingerprint"] == loader.get_state()["fingerprint"]


def test_quarantine_log_nested_too_deeply_raises_naming_log_and_line(tmp_path):
    """A 100k-deep JSON line in the log is a clear error naming the log and the line, not a
    RecursionError; a hand-written note before it is still skipped."""
    log = tmp_path / "q.jsonl"
    log.write_text("a note\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    loader = _loader(log, {7}, num_epochs=1, prefetch=None)

    with pytest.raises(ValueError, match="nested too deeply") as info:
        _drain(loader)

    assert f"{str(log)!r}, line 2" in str(info.value)
    assert isinstance(info.value.__cause__, RecursionError)


def test_quarantine_log_is_fsynced_before_the_state_is_taken(tmp_path, monkeypatch):
    """get_state (what a checkpoint saves) first fsyncs the lines appended since the last
    one, and the folder of a log it created; with nothing new it syncs nothing."""
    synced: list[str] = []
    fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    log = tmp_path / "q.jsonl"
    loader = _loader(log, {7}, num_epochs=1, prefetch=None)
    _drain(loader)
    assert synced == [] and len(_lines(log)) == 1  # appended, not yet synced

    state = loader.get_state()

    assert synced == [str(log), str(tmp_path)]
    loader.get_state()
    assert len(synced) == 2
    assert (state["epoch"], state["offset"]) == (1, 0)


def test_skip_replacement_is_a_seeded_function_of_seed_epoch_and_index(tmp_path):
    """The replacement of a record differs between epochs and seeds, never between runs."""
    def replacements(seed):
        log = tmp_path / f"q-{seed}.jsonl"
        _drain(_loader(log, {7}, seed=seed, num_epochs=3))
        return [line["replacement"] for line in _lines(log)]

    assert replacements(0) == replacements(0)
    assert replacements(0) != replacements(1)
    assert len(set(replacements(0))) > 1


@settings(max_examples=50, deadline=None)
@given(
    bad=st.sets(st.integers(0, _NUM - 1), max_size=8),
    seed=st.integers(0, 2**64 - 1),
    batch_size=st.integers(1, 7),
    data=st.data(),
)
def test_skip_stream_after_restore_equals_uninterrupted_run(bad, seed, batch_size, data):
    """Random failing sets and break points: the restored stream, its replacements and the
    quarantine log are those of the uninterrupted run."""
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "q.jsonl")

        def make():
            return _loader(log, bad, seed=seed, batch_size=batch_size, with_metadata=True)

        reference, states = [], []
        loader = make()
        states.append(loader.get_state())
        for batch, meta in loader:
            reference.append((batch.numpy(), meta["index"].numpy()))
            states.append(loader.get_state())
        logged = sorted(map(json.dumps, _lines(log)))
        point = data.draw(st.integers(0, len(reference)), label="break point")

        resumed = make()
        resumed.set_state(json.loads(json.dumps(states[point])))
        rest = [(b.numpy(), m["index"].numpy()) for b, m in resumed]

        assert len(rest) == len(reference) - point
        for (got, got_ids), (want, want_ids) in zip(rest, reference[point:], strict=True):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got_ids, want_ids)
        ids = np.concatenate([b for b, _ in reference])[:, 0]
        assert not set(ids.tolist()) & bad
        np.testing.assert_array_equal(np.concatenate([i for _, i in reference]), ids)
        assert sorted(map(json.dumps, _lines(log))) == logged  # nothing logged twice


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_skip_with_workers_streams_and_logs_as_the_calling_thread(worker_type, tmp_path):
    """Thread and process workers: the same batches, and the same quarantine lines."""
    serial = _drain(_loader(tmp_path / "serial.jsonl", {2, 7, 11}))
    loader = _loader(tmp_path / "workers.jsonl", {2, 7, 11}, workers=Workers(2, kind=worker_type))

    with loader:
        stream = _drain(loader)

    for got, want in zip(stream, serial, strict=True):
        np.testing.assert_array_equal(got, want)
    assert _lines(tmp_path / "workers.jsonl") == _lines(tmp_path / "serial.jsonl")
    assert len(_lines(tmp_path / "serial.jsonl")) == 6


def test_skip_dataset_and_advance_stream_equals_loop(tmp_path):
    """`dataset()` + `advance()` hands out the same replaced batches as `for batch in loader`."""
    loop = _drain(_loader(tmp_path / "a.jsonl", {5, 9}))
    loader = _loader(tmp_path / "b.jsonl", {5, 9})

    stream = []
    for batch in loader.dataset():
        stream.append(batch.numpy())
        loader.advance()

    for got, want in zip(stream, loop, strict=True):
        np.testing.assert_array_equal(got, want)


def test_skip_batched_source_falls_back_to_records_with_the_same_stream(tmp_path):
    """A failing `read_batch` is read again record by record: the per-record source's stream."""
    per_record = _drain(_loader(tmp_path / "a.jsonl", {4, 20}))
    loader = _loader(tmp_path / "b.jsonl", {4, 20}, batched=True)

    stream = _drain(loader)

    assert loader.describe().count("read_batch") >= 1
    for got, want in zip(stream, per_record, strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(_lines(tmp_path / "b.jsonl")) == 4


def test_skip_batches_made_again_name_their_replacements_each_time(tmp_path):
    """An abandoned iteration's read-ahead and a new one from the start: the metadata of
    every replaced batch names its replacements, and the log holds each once."""
    log = tmp_path / "q.jsonl"
    loader = _loader(log, {1, 2, 7, 8, 19, 25}, with_metadata=True, num_epochs=1)
    first = [m["index"].numpy() for _, (_, m) in zip(range(3), loader, strict=False)]
    loader.set_state(dict(loader.get_state(), offset=0))

    again = [(b.numpy()[:, 0], m["index"].numpy()) for b, m in loader]

    for ids, meta_ids in again:
        np.testing.assert_array_equal(meta_ids, ids)
    for got, (want, _) in zip(first, again, strict=False):
        np.testing.assert_array_equal(got, want)
    lines = [(line["epoch"], line["position"]) for line in _lines(log)]
    assert len(lines) == len(set(lines)) == 6


def _fail_on_seven(record, rng):
    if len(record) == 7:
        msg = "seven tokens"
        raise ValueError(msg)
    return record


def test_skip_variable_length_records_replaced_in_ragged_batches(tmp_path):
    """Ragged leaves: the replaced batch is assembled (and wire-encoded) like any other."""
    tokens = [np.arange(n % 9, dtype=np.int64) for n in range(20)]
    pipeline = Pipeline(tokens, seed=0).shuffle().map(_fail_on_seven)
    pipeline = pipeline.on_error("skip", max_fraction=1.0, quarantine=tmp_path / "q.jsonl")
    loader = ResumableLoader.from_pipeline(
        pipeline.with_output_signature(tf.TensorSpec((None,), tf.int64)).batch(4), num_epochs=1
    )

    lengths = [n for b in loader for n in b.row_lengths().numpy().tolist()]

    assert len(lengths) == 20 and 7 not in lengths
    assert [line["record_index"] for line in _lines(tmp_path / "q.jsonl")] == [7, 16]


def _truncate_seven(record, rng):
    return record[:1] if int(record[0]) == 7 else record


def test_skip_record_not_matching_the_spec_is_replaced(tmp_path):
    """A record whose shape differs from the element spec is a failing record too."""
    loader = _loader(tmp_path / "q.jsonl", set(), map_fn=_truncate_seven, num_epochs=1)

    stream = _drain(loader)

    assert 7 not in np.concatenate(stream)[:, 0].tolist()
    [line] = _lines(tmp_path / "q.jsonl")
    assert (line["record_index"], line["error"]) == (7, "RecordSpecError")


def test_skip_first_record_failing_spec_comes_from_its_replacement(tmp_path):
    """Record 0 (read to infer the spec) failing is replaced there too."""
    loader = _loader(tmp_path / "q.jsonl", {0}, num_epochs=1)

    stream = _drain(loader)

    assert loader.element_spec == tf.TensorSpec((None, 2), tf.int64)
    assert 0 not in np.concatenate(stream)[:, 0].tolist()


def test_skip_no_candidate_left_raises_record_error_naming_them(tmp_path):
    """When every candidate fails too, the stream ends with RecordError naming them."""
    bad = set(range(_NUM))
    pipeline = _pipeline(bad).on_error("skip", quarantine=tmp_path / "q.jsonl").batch(4)
    loader = ResumableLoader.from_pipeline(
        pipeline.with_output_signature(tf.TensorSpec((2,), tf.int64)), num_epochs=1
    )

    with pytest.raises(RecordError, match="found no replacement: the 16 candidate") as info:
        _drain(loader)

    assert info.value.position == 0
    assert isinstance(info.value.__cause__, ValueError)


def test_skip_mixture_replacements_are_records_of_the_mixture(tmp_path):
    """In a mixture a replacement is a record of the mixture's epoch (any source)."""
    web, code = fns.BadRecordSource(29, {3, 17}), fns.BadRecordSource(11, {4})
    pipeline = Pipeline.mix({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=3)
    pipeline = pipeline.on_error("skip", max_fraction=1.0, quarantine=tmp_path / "q.jsonl")
    loader = ResumableLoader.from_pipeline(pipeline.batch(5), num_epochs=2, with_metadata=True)

    stream = [(b.numpy(), m["index"].numpy()) for b, m in loader]

    lines = _lines(tmp_path / "q.jsonl")
    assert lines
    for batch, keys in stream:
        for row, key in zip(batch.tolist(), keys.tolist(), strict=True):
            name, _, record = loader.pipeline.source.locate(key)
            assert row[0] == record
            assert (name, record) not in {("web", 3), ("web", 17), ("code", 4)}


def _records(loader) -> np.ndarray:
    return np.concatenate(_drain(loader))[:, 0]


def test_skip_replacement_does_not_depend_on_the_shard_layout(tmp_path):
    """Each shard holds, at each global offset, what the single-shard stream holds there."""
    bad = {2, 7, 8, 19}
    single = _records(_loader(tmp_path / "one.jsonl", bad, batch_size=3)).reshape(2, _NUM)

    for shard in range(2):
        log = tmp_path / f"two-{shard}.jsonl"
        loader = _loader(log, bad, batch_size=3, shard=Shard(shard, 2))
        got = _records(loader).reshape(2, _NUM // 2)
        np.testing.assert_array_equal(got, single[:, shard::2])
        assert {line["shard_index"] for line in _lines(log)} == {shard}


def test_skip_checkpoint_of_one_shard_resumes_on_two(tmp_path):
    """A change of shard count: both shards continue the single-shard stream exactly."""
    bad = {2, 7, 8, 19}
    single = _loader(tmp_path / "one.jsonl", bad, batch_size=4)
    rest = _records(single).reshape(2, _NUM)
    single = _loader(tmp_path / "one.jsonl", bad, batch_size=4)
    for _, _ in zip(range(3), single, strict=False):
        pass
    state = single.get_state()
    assert (state["epoch"], state["offset"]) == (0, 12)

    for shard in range(2):
        loader = _loader(tmp_path / f"two-{shard}.jsonl", bad, batch_size=2, shard=Shard(shard, 2))
        loader.set_state(state)
        got = _records(loader)
        want = np.concatenate([rest[0, 12 + shard :: 2], rest[1, shard::2]])
        np.testing.assert_array_equal(got, want)


# -- a callable ----------------------------------------------------------------------


@pytest.mark.parametrize("worker_type", [None, "process"], ids=["calling-thread", "process"])
def test_callable_policy_record_replaces_failing_record(worker_type, tmp_path):
    """The callable's record takes the failing one's place; the log names the policy."""
    workers = {} if worker_type is None else {"workers": Workers(1, kind=worker_type)}
    loader = _loader(tmp_path / "q.jsonl", {7}, fns.placeholder, num_epochs=1, **workers)

    with loader:
        rows = np.concatenate(_drain(loader)).tolist()

    assert rows[_positions(loader, 7)] == [-1, 7]
    [line] = _lines(tmp_path / "q.jsonl")
    assert (line["policy"], line["replacement"], line["record_index"]) == ("callable", None, 7)


def _reraise(record_index, epoch, error):
    raise error


def _refuse(record_index, epoch, error):
    msg = "no placeholder for this one"
    raise KeyError(msg)


@pytest.mark.parametrize(
    ("policy", "cause", "match"),
    [(_reraise, ValueError, "record 7 is corrupt"),
     (_refuse, KeyError, "The on_error policy _refuse raised KeyError on record index 7")],
    ids=["re-raises-the-error", "raises-another"],
)
def test_callable_policy_raising_ends_stream_with_record_error(policy, cause, match, tmp_path):
    """A callable that raises ends the stream with RecordError on that record, chained."""
    loader = _loader(tmp_path / "q.jsonl", {7}, policy, num_epochs=1)

    with pytest.raises(RecordError, match=match) as info:
        _drain(loader)

    assert info.value.record_index == 7
    assert isinstance(info.value.__cause__, cause)


def _wrong_shape(record_index, epoch, error):
    return np.zeros(3, dtype=np.int64)


def test_callable_policy_record_of_wrong_spec_raises_record_spec_error(tmp_path):
    """A callable's record that does not match the element spec raises RecordSpecError."""
    loader = _loader(tmp_path / "q.jsonl", {7}, _wrong_shape, num_epochs=1)

    match = "policy _wrong_shape's replacement of Record"
    with pytest.raises(RecordSpecError, match=match) as info:
        _drain(loader)

    assert info.value.record_index == 7


# -- the error budget ------------------------------------------------------------------


def test_budget_exceeded_raises_naming_budget_count_and_log(tmp_path):
    """The replacement past max_fraction of an epoch raises ErrorBudgetError, logged first."""
    log = tmp_path / "q.jsonl"
    loader = _loader(log, {3, 11, 20}, max_fraction=0.05, num_epochs=1)  # 1 of 30 allowed
    second = sorted(_positions(loader, i) for i in (3, 11, 20))[1]

    with pytest.raises(ErrorBudgetError) as info:
        _drain(loader)

    message = str(info.value)
    assert f"2 records of epoch 0 up to position {second} were replaced" in message
    assert "max_fraction=0.05 of its 30 records allows 1" in message
    assert str(log) in message
    assert info.value.position == second
    assert isinstance(info.value, RecordError)
    assert len(_lines(log)) == 2
    assert loader.position == second // 4 * 4


def test_budget_restored_run_raises_where_the_uninterrupted_run_does(tmp_path):
    """The budget counts the log's earlier replacements: a restore past the first still raises
    at the second."""
    log = tmp_path / "q.jsonl"
    loader = _loader(log, {3, 11}, max_fraction=0.05, num_epochs=1, prefetch=None)
    first, second = sorted(_positions(loader, i) for i in (3, 11))
    states = {}
    with pytest.raises(ErrorBudgetError):
        for _ in loader:
            states[loader.position] = loader.get_state()
    restore_at = max(p for p in states if first < p <= second)
    kept = [line for line in _lines(log) if line["position"] < restore_at]
    log.write_text("".join(json.dumps(line) + "\n" for line in kept))  # crashed before
    resumed = _loader(log, {3, 11}, max_fraction=0.05, num_epochs=1, prefetch=None)
    resumed.set_state(states[restore_at])

    with pytest.raises(ErrorBudgetError, match="2 records of epoch 0 up to") as info:
        _drain(resumed)

    assert info.value.position == second


def test_budget_counts_per_epoch(tmp_path):
    """Each epoch has its own budget: one replacement per epoch fits max_fraction=1/30."""
    loader = _loader(tmp_path / "q.jsonl", {7}, max_fraction=1 / _NUM, num_epochs=3)

    assert len(_drain(loader)) == 3 * 8
    assert [line["epoch"] for line in _lines(tmp_path / "q.jsonl")] == [0, 1, 2]


def test_budget_of_decimal_fraction_is_exact(tmp_path):
    """max_fraction=0.29 of 100 records allows 29 replacements (0.29 * 100 is 28.999... in
    floating point), and the 30th raises."""
    log = tmp_path / "q.jsonl"
    pipeline = _pipeline(set(range(29)), num_records=100)
    pipeline = pipeline.on_error("skip", max_fraction=0.29, quarantine=log).batch(10)

    assert len(_drain(ResumableLoader.from_pipeline(pipeline, num_epochs=1))) == 10
    assert len(_lines(log)) == 29
    over = _pipeline(set(range(30)), num_records=100)
    over = over.on_error("skip", max_fraction=0.29, quarantine=tmp_path / "over.jsonl")
    with pytest.raises(ErrorBudgetError, match="of its 100 records allows 29"):
        _drain(ResumableLoader.from_pipeline(over.batch(10), num_epochs=1))


@pytest.mark.parametrize(
    ("fraction", "num_records", "allowed"),
    [(0.29, 100, 29), (0.07, 100, 7), (1 / 30, 30, 1), (0.05, 30, 1), (0.0, 10**12, 0),
     (1.0, 7, 7), (0.1, 10**15, 10**14)],
    ids=["0.29", "0.07", "one-thirtieth", "0.05-of-30", "zero", "one", "0.1-of-1e15"],
)
def test_budget_allowed_is_floor_of_the_written_fraction(fraction, num_records, allowed):
    """The budget is floor(max_fraction * records) for the decimal or fraction written."""
    policy = on_error.ErrorPolicy("skip", max_fraction=fraction, quarantine="q.jsonl")
    assert policy.allowed(num_records) == allowed


def test_dataset_budget_exceeded_raises_tf_error_with_the_budget_message(tmp_path):
    """Through `dataset()` the budget error reaches the loop as tf.data's error, no hang."""
    loader = _loader(tmp_path / "q.jsonl", {3, 11}, max_fraction=0.0, num_epochs=1)

    with pytest.raises(tf.errors.OpError, match="error budget is exceeded"):
        list(loader.dataset())

    assert len(_lines(tmp_path / "q.jsonl")) >= 1


# -- the state ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "fields"),
    [("skip", {"on_error.policy": "skip", "on_error.algorithm": on_error.ALGORITHM,
               "on_error.max_tries": 16}),
     (fns.placeholder, {"on_error.policy": "callable"})],
    ids=["skip", "callable"],
)
def test_replacing_policy_enters_the_order_fields(policy, fields, tmp_path):
    """A replacing policy's fields are order fields (not the budget nor the log path)."""
    pipeline = Pipeline(np.arange(5), seed=0).on_error(policy, quarantine=tmp_path / "q")

    order = pipeline.order_fields()

    assert {k: v for k, v in order.items() if k.startswith("on_error.")} == fields


def test_raise_checkpoint_resumes_in_skip_pipeline_exactly(tmp_path):
    """A job that stopped at a bad record resumes with "skip": its state is accepted and the
    stream is the skip pipeline's uninterrupted one."""
    clean = ResumableLoader.from_pipeline(_pipeline(set()).batch(4), num_epochs=1)
    bad = {int(clean.plan.indices(0, 13, 14)[0])}  # in the fourth batch
    raising = ResumableLoader.from_pipeline(_pipeline(bad).batch(4), num_epochs=1)
    consumed = 0
    with pytest.raises(RecordError):
        for _ in raising:
            consumed += 1
            state = raising.get_state()
    skipping = _loader(tmp_path / "q.jsonl", bad, num_epochs=1)
    reference = _drain(_loader(tmp_path / "r.jsonl", bad, num_epochs=1))

    skipping.set_state(state)

    for got, want in zip(_drain(skipping), reference[consumed:], strict=True):
        np.testing.assert_array_equal(got, want)


def test_skip_checkpoint_in_callable_pipeline_refused_naming_the_policy(tmp_path):
    """Two replacing policies differ in what they put there: the restore is refused."""
    state = _loader(tmp_path / "q.jsonl", {7}).get_state()
    other = _loader(tmp_path / "q.jsonl", {7}, fns.placeholder)

    with pytest.raises(StateMismatchError) as info:
        other.set_state(state)

    assert "on_error.policy: checkpoint has 'skip', this loader has 'callable'" in str(info.value)


# -- arguments and the guard ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"policy": "ignore"}, ValueError, "must be 'raise', 'skip' or a callable"),
     ({"policy": 3}, TypeError, "Received: policy=3 of type int"),
     ({"policy": "skip", "max_fraction": 1.5}, ValueError, "max_fraction=1.5"),
     ({"policy": "skip", "max_fraction": "1%"}, TypeError, "max_fraction='1%' of type str"),
     ({"policy": "skip", "quarantine": None}, ValueError, "`quarantine` is required"),
     ({"policy": "skip", "quarantine": "/nonexistent/folder/q.jsonl"}, ValueError,
      "folder must exist"),
     ({"policy": "skip", "quarantine": 3}, TypeError, "must be a path")],
    ids=["unknown-mode", "not-callable", "fraction-too-large", "fraction-not-a-number",
         "no-quarantine", "missing-folder", "quarantine-not-a-path"],
)
def test_on_error_invalid_argument_raises(kwargs, error, match, tmp_path):
    """A bad policy, budget or log path is refused when the pipeline is built."""
    kwargs = {"quarantine": tmp_path / "q.jsonl", **kwargs}
    pipeline = Pipeline(np.arange(5), seed=0)

    with pytest.raises(error, match=match) as info:
        pipeline.on_error(kwargs.pop("policy"), **kwargs)

    assert "Received" in str(info.value)


def test_dataset_ignore_errors_refused_naming_on_error():
    """`ignore_errors()` after `dataset()` is refused, pointing at `Pipeline.on_error`."""
    loader = ResumableLoader(np.arange(8), batch_size=4, seed=0, num_epochs=1)

    with pytest.raises(StreamIntegrityError) as info:
        loader.dataset().ignore_errors()

    assert "Pipeline.on_error('skip', quarantine=path)" in str(info.value)
