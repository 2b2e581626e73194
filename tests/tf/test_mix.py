"""Tests of weighted mixing: `Pipeline.mix`, `MixStage`, `ConcatSource`, and mixed loaders."""

from __future__ import annotations

import fractions
import json
import sys
from pathlib import Path

import _worker_fns
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import Pipeline, ResumableLoader, Shard, StateMismatchError, Workers, cli
from resumeloader.sources import ArraySource, ConcatSource
from resumeloader.stages import MixStage
from resumeloader.stages.plan import Plan
from resumeloader.tools import inspect

F = fractions.Fraction
SCRIPT = Path(__file__).parents[1] / "scripts" / "train_mix.py"
WEB = np.arange(40, dtype=np.int64)  # records 0..39
CODE = np.arange(1000, 1012, dtype=np.int64)  # records 1000..1011


def mixed(seed: int = 5, **overrides) -> Pipeline:
    """The 70/30 mixture of WEB and CODE (names sort as code, web: code is part 0)."""
    kwargs = {"weights": {"web": 0.7, "code": 0.3}, "seed": seed, **overrides}
    return Pipeline.mix({"web": WEB, "code": CODE}, **kwargs)


def decode(source: ConcatSource, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(part, lap, record in part) of each key, vectorised."""
    lap, flat = np.divmod(keys, len(source))
    part = np.searchsorted(np.asarray(source.starts), flat, side="right") - 1
    return part, lap, flat - np.asarray(source.starts)[part]


mixtures = st.lists(
    st.tuples(st.integers(1, 25), st.fractions(F(1, 9), 9, max_denominator=9)),
    min_size=1,
    max_size=5,
)


def build(parts: list[tuple[int, F]], seed: int, num_positions: int) -> Pipeline:
    sources = {f"s{k}": np.arange(length) for k, (length, _) in enumerate(parts)}
    weights = {f"s{k}": weight for k, (_, weight) in enumerate(parts)}
    return Pipeline.mix(sources, weights=weights, seed=seed, records_per_epoch=num_positions)


# -- the invariants --------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(parts=mixtures, seed=st.integers(0, 2**64 - 1), num_positions=st.integers(1, 600))
def test_mix_every_prefix_count_within_one_of_weight(parts, seed, num_positions):
    """The keys of any prefix of n positions hold weight x n records of each source, +-1."""
    pipeline = build(parts, seed, num_positions)
    stage = pipeline.index_stage
    part, _, _ = decode(pipeline.source, stage.indices(0, np.arange(num_positions), seed=seed))
    onehot = np.zeros((num_positions + 1, len(parts)), np.int64)
    onehot[np.arange(1, num_positions + 1), part] = 1
    counts = np.cumsum(onehot, axis=0)
    n = np.arange(num_positions + 1)[:, None]
    weights = np.array([float(w) for w in stage.weights])[None, :]
    assert (np.abs(counts - weights * n) < 1 + 1e-9).all()
    assert counts[-1].tolist() == list(stage.counts(num_positions).values())


@settings(max_examples=80, deadline=None)
@given(parts=mixtures, seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 3))
def test_mix_each_source_walks_consecutive_permutations(parts, seed, epoch):
    """Per source, in stream order: lap j is a permutation of its records, laps in order."""
    pipeline = build(parts, seed, 300)
    stage = pipeline.index_stage
    keys = np.concatenate([stage.indices(e, np.arange(300), seed=seed) for e in range(epoch + 1)])
    part, lap, record = decode(pipeline.source, keys)
    for k, (length, _) in enumerate(parts):
        walk_laps, walk = lap[part == k], record[part == k]
        assert (walk_laps == np.arange(len(walk)) // length).all()
        for j in range(len(walk) // length):
            assert sorted(walk[j * length : (j + 1) * length].tolist()) == list(range(length))


@settings(max_examples=40, deadline=None)
@given(parts=mixtures, seed=st.integers(0, 2**64 - 1), shard_count=st.integers(2, 5))
def test_mix_shard_union_is_global_order(parts, seed, shard_count):
    """Shards' positions interleaved (offset p * S + s) give exactly the global order."""
    pipeline = build(parts, seed, 120).batch(4)
    whole = Plan(pipeline, num_epochs=2)
    shards = [
        Plan(pipeline, num_epochs=2, shard=Shard(s, shard_count))
        for s in range(shard_count)
    ]
    for epoch in range(2):
        kept = 120 - 120 % shard_count
        merged = np.empty(kept, np.int64)
        for s, plan in enumerate(shards):
            merged[s::shard_count] = plan.indices(epoch, 0, plan.records_per_epoch)
        assert merged.tolist() == whole.indices(epoch, 0, kept).tolist()


def test_mix_key_depends_only_on_position_not_on_calls():
    """Offsets asked in any order, alone or together, give the same keys (no history)."""
    pipeline = mixed()
    stage, seed = pipeline.index_stage, pipeline.seed
    offsets = np.arange(stage.num_records)
    together = stage.indices(3, offsets, seed=seed)
    shuffled = np.random.default_rng(0).permutation(offsets)
    assert (stage.indices(3, shuffled, seed=seed) == together[shuffled]).all()
    assert [int(stage.indices(3, np.array([o]), seed=seed)[0]) for o in offsets] == (
        together.tolist())


def test_mix_golden_keys_pinned():
    """The first keys of the 70/30 mixture for seed 5 (changing them is a breaking change)."""
    pipeline = mixed()
    keys = pipeline.index_stage.indices(0, np.arange(12), seed=pipeline.seed).tolist()
    assert keys == GOLDEN_KEYS


GOLDEN_KEYS = [18, 27, 7, 43, 33, 6, 41, 48, 11, 42, 23, 44]


# -- epochs and identity -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "expected"),
    [("first_exhausted", 39), ("all_exhausted", 57), (25, 25)],
    ids=["first-exhausted", "all-exhausted", "fixed"],
)
def test_mix_records_per_epoch_rule_sets_epoch_length(rule, expected):
    """code (12 records, 3/10) runs out after 39 positions; web (40, 7/10) after 57; or a number."""
    loader = ResumableLoader.from_pipeline(
        mixed(records_per_epoch=rule).batch(8), num_epochs=1, prefetch=None
    )
    assert loader.num_records == expected
    assert loader.batches_per_epoch == -(-expected // 8)
    assert loader.get_state()["mix.records_per_epoch"] == expected


def test_mix_first_exhausted_epoch_holds_smallest_source_exactly_once():
    """In epoch 0 of "first_exhausted", code's 12 records each come once, 27 of web's 40."""
    pipeline = mixed()
    loader = ResumableLoader.from_pipeline(pipeline.batch(8), num_epochs=1, prefetch=None)
    records = np.concatenate([batch.numpy() for batch in loader])
    assert sorted(records[records >= 1000].tolist()) == CODE.tolist()
    web = records[records < 1000]
    assert len(web) == 27 and len(set(web.tolist())) == 27


def test_mix_repeated_record_gets_new_map_rng_on_each_lap():
    """A 2-record source repeats; each repeat's rng differs (its key has another lap)."""
    pipeline = Pipeline.mix(
        {"big": np.zeros((50, 1), np.float32), "tiny": np.ones((2, 1), np.float32)},
        weights={"big": 1, "tiny": 1},
        seed=0,
        shuffle=False,
        records_per_epoch=100,  # tiny's 2 records 50 times: 25 laps
    ).map(_worker_fns.augment)
    loader = ResumableLoader.from_pipeline(
        pipeline.batch(10), num_epochs=1, prefetch=None, with_metadata=True
    )
    tiny = [
        (value, pipeline.source.locate(key))
        for data, meta in loader
        for value, key in zip(data.numpy()[:, 0], meta["index"].numpy(), strict=True)
        if pipeline.source.locate(key)[0] == "tiny"
    ]
    assert len(tiny) == 50 and {record for _, (_, _, record) in tiny} == {0, 1}
    assert len({float(value) for value, _ in tiny}) == 50


def test_mix_metadata_index_locates_source_lap_and_record():
    """Metadata index = lap * total + concatenated index; `source.locate` decodes it."""
    pipeline = mixed(shuffle=False, records_per_epoch=100)
    loader = ResumableLoader.from_pipeline(
        pipeline.batch(100), num_epochs=1, prefetch=None, with_metadata=True
    )
    data, meta = next(iter(loader))
    sources = {"web": WEB, "code": CODE}
    located = [pipeline.source.locate(key) for key in meta["index"].numpy()]
    for position, (value, (name, lap, record)) in enumerate(
        zip(data.numpy(), located, strict=True)
    ):
        walked = pipeline.index_stage.counts(position)[name]  # its records before this one
        assert (lap, record) == divmod(walked, len(sources[name]))
        assert value == sources[name][record]
    assert max(lap for _, lap, _ in located) == 2  # code: 30 of 100 positions, 12 records


def test_mix_process_workers_stream_equals_calling_thread():
    """Process workers (pipeline pickled once) deliver the calling thread's stream."""
    pipeline = (
        Pipeline.mix(
            {"web": WEB.astype(np.float32), "code": CODE.astype(np.float32)},
            weights={"web": 0.7, "code": 0.3},
            seed=11,
        )
        .map(_worker_fns.augment)
        .batch(6)
    )
    streams = [
        [
            b.numpy().tolist()
            for b in ResumableLoader.from_pipeline(
                pipeline, num_epochs=2, prefetch=None,
                workers=Workers(workers, kind="process" if workers else None),
            )
        ]
        for workers in (0, 2)
    ]
    assert streams[0] == streams[1]


# -- resume ----------------------------------------------------------------------------
def _loader(pipeline: Pipeline, **kwargs) -> ResumableLoader:
    return ResumableLoader.from_pipeline(pipeline, num_epochs=3, prefetch=None, **kwargs)


def test_mix_restore_at_epoch_50_of_a_million_continues_exactly():
    """A state at epoch 50 of 10**6 records restores to the batch the stage derives there."""
    pipeline = mixed(records_per_epoch=10**6).batch(64)
    loader = ResumableLoader.from_pipeline(pipeline, prefetch=None, with_metadata=True)
    state = dict(loader.get_state(), epoch=50, offset=654_336)
    fresh = ResumableLoader.from_pipeline(pipeline, prefetch=None, with_metadata=True)
    fresh.set_state(state)
    _, meta = next(iter(fresh))
    expected = pipeline.index_stage.indices(50, np.arange(654_336, 654_400), seed=pipeline.seed)
    assert meta["index"].numpy().tolist() == expected.tolist()
    assert (meta["epoch"].numpy() == 50).all()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"weights": {"web": 1, "code": 1}}, "mix.weights: checkpoint has 'code:3/10,web:7/10'"),
        ({"shuffle": False}, "mix.shuffle: checkpoint has 1"),
        ({"records_per_epoch": 38}, "mix.records_per_epoch: checkpoint has 39"),
    ],
    ids=["weights", "shuffle", "epoch-length"],
)
def test_mix_restore_with_other_configuration_raises_naming_field(change, field):
    """Other weights (or walk, or epoch) would change records already trained on: refused."""
    saved = _loader(mixed().batch(4))
    saved.advance(3)
    other = _loader(mixed(**change).batch(4))
    with pytest.raises(StateMismatchError) as info:
        other.set_state(saved.get_state())
    assert field in str(info.value)
    assert other.position == 0


def test_mix_restore_with_other_source_length_raises_naming_source():
    """A source with other records is named by its own field, source.<name>.num_records."""
    saved = _loader(mixed().batch(4))
    other = _loader(
        Pipeline.mix(
            {"web": WEB[:30], "code": CODE}, weights={"web": 0.7, "code": 0.3}, seed=5
        ).batch(4)
    )
    with pytest.raises(StateMismatchError) as info:
        other.set_state(saved.get_state())
    assert "source.web.num_records: checkpoint has 40, this loader has 30" in str(info.value)


def _global_order(shards: list[ResumableLoader], num_steps: int) -> list[int]:
    """The records of `num_steps` global steps in global order (shard s holds s::S)."""
    iterators = [iter(shard) for shard in shards]
    order: list[int] = []
    for _ in range(num_steps):
        batches = [next(it).numpy() for it in iterators]
        step = np.empty(sum(len(b) for b in batches), np.int64)
        for s, batch in enumerate(batches):
            step[s :: len(shards)] = batch
        order += step.tolist()
    return order


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 8), (1, 8)), ((2, 8), (4, 8)), ((1, 8), (1, 4)), ((2, 8), (2, 12))],
    ids=["2-to-1-shards", "2-to-4-shards", "batch-8-to-4", "batch-8-to-12"],
)
def test_mix_elastic_resume_continues_global_stream(before, after):
    """A mixed state saved by S shards (global batch B) continues exactly with S' and B'."""
    pipeline = mixed(records_per_epoch=48)

    def shards(count: int, global_batch: int) -> list[ResumableLoader]:
        return [
            ResumableLoader.from_pipeline(
                pipeline.batch(global_batch // count),
                num_epochs=2,
                prefetch=None,
                shard=Shard(s, count),
            )
            for s in range(count)
        ]

    reference = _global_order(shards(1, 24), 4)  # 96 records: 2 epochs of 48
    first = shards(*before)
    _global_order(first, 24 // before[1])  # 24 records consumed
    resumed = shards(*after)
    for loader in resumed:
        loader.set_state(first[0].get_state())
    assert _global_order(resumed, 72 // after[1]) == reference[24:]


@pytest.mark.usefixtures("clean_keras")
def test_mix_keras_fit_epochs_are_mixture_epochs_across_a_restart(tmp_path):
    """Keras epoch e is mixture epoch e: a job restarted after epoch 0 runs epoch 1 only."""
    import keras

    import resumeloader.keras

    seen: list[list[int]] = []

    def train(epochs: int) -> list[int]:
        pipeline = (
            Pipeline.mix(
                {"a": np.arange(30, dtype=np.float32)[:, None], "b": -np.ones((9, 1), np.float32)},
                weights={"a": 2, "b": 1},
                seed=0,
            )
            .map(lambda record, rng: (record, record))
            .batch(4)
        )
        loader = ResumableLoader.from_pipeline(pipeline, num_epochs=3)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        resume = resumeloader.keras.ResumeCallback(loader, str(tmp_path), save_every=3)
        history = model.fit(
            resumeloader.keras.epoch_dataset(loader), epochs=epochs, verbose=0, callbacks=[resume]
        )
        seen.append([loader.num_records, loader.batches_per_epoch, loader.position])
        return history.epoch

    assert train(epochs=1) == [0]
    assert train(epochs=2) == [1]
    assert seen == [[27, 7, 27], [27, 7, 54]]


# -- bad input -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sources": [WEB]}, TypeError, "`sources` must be of type Mapping"),
        ({"weights": {"web": 1}}, ValueError, "sources without a weight: ['code']"),
        ({"weights": {"web": 1, "code": 0}}, ValueError, "weights['code']"),
        ({"records_per_epoch": "forever"}, ValueError, "'first_exhausted', 'all_exhausted'"),
        ({"records_per_epoch": 0}, ValueError, "records_per_epoch"),
        ({"weights": {"web": F(1, 2_000_000), "code": 1}}, ValueError, "common denominator"),
        ({"sources": {"web": WEB, "code": CODE.astype(np.float32)}}, ValueError, "one structure"),
        (
            {"sources": {"web.v2": WEB, "code": CODE}, "weights": {"web.v2": 1, "code": 1}},
            ValueError,
            "Source names must be",
        ),
        ({"sources": {"web": WEB, "code": []}}, ValueError, "Mixture source 'code'"),
    ],
    ids=[
        "not-mapping",
        "missing-weight",
        "zero-weight",
        "bad-rule",
        "zero-epoch",
        "huge-period",
        "other-dtype",
        "dotted-name",
        "empty-source",
    ],
)
def test_mix_bad_argument_raises_naming_it(kwargs, error, message):
    """Each bad argument raises, naming what is wrong and what was received."""
    arguments = {
        "sources": {"web": WEB, "code": CODE},
        "weights": {"web": 7, "code": 3},
        "seed": 0,
        **kwargs,
    }
    sources = arguments.pop("sources")
    with pytest.raises(error) as info:
        Pipeline.mix(sources, **arguments)
    assert message in str(info.value)


def test_mix_stage_mismatched_entries_raise():
    """A MixStage built by hand needs one name, length and weight per source."""
    with pytest.raises(ValueError, match="one entry per source") as info:
        MixStage(["a", "b"], [3], [F(1), F(1)], shuffle=True)
    assert "2 names, 1 lengths, 2 weights" in str(info.value)


def test_pipeline_shuffle_on_mixture_raises():
    """shuffle() would replace the mixture's order with one over the concatenation: refused."""
    with pytest.raises(ValueError, match=r"`shuffle\(\)` orders a single source") as info:
        mixed().shuffle()
    assert "Pipeline.mix(..., shuffle=False)" in str(info.value)


# -- the concatenating source ----------------------------------------------------------
def test_concat_source_read_batch_equals_reads_across_parts_and_laps():
    """read_batch of keys from several parts and laps stacks what read gives one by one."""
    source = ConcatSource(
        {"b": ArraySource({"x": np.arange(5.0)}), "a": ArraySource({"x": -np.arange(3.0)})}
    )
    keys = np.array([0, 3, 7, 2, 8 + 1, 8 * 4 + 6], dtype=np.int64)
    batch = source.read_batch(keys)["x"]
    assert batch.tolist() == [float(source.read(int(k))["x"]) for k in keys]
    assert (source.names, source.starts, len(source)) == (("a", "b"), (0, 3), 8)
    assert source.locate(8 * 4 + 6) == ("b", 4, 3)


def test_concat_source_read_batch_unstackable_parts_raises():
    """Parts whose records have other sizes (same rank) cannot share a batch: a clear error."""
    source = ConcatSource({"a": ArraySource(np.zeros((3, 2))), "b": ArraySource(np.zeros((3, 5)))})
    with pytest.raises(ValueError, match="Records of one batch must stack") as info:
        source.read_batch(np.array([0, 4]))
    assert "float64[5]" in str(info.value) and "float64[2]" in str(info.value)


def test_mix_stage_describe_and_order_fields_name_every_source():
    """describe() and the order fields show each source's weight and length."""
    pipeline = mixed()
    assert isinstance(pipeline.index_stage, MixStage)
    assert "mix(code 3/10, web 7/10" in pipeline.index_stage.describe()
    fields = pipeline.order_fields()
    assert fields["source.code.num_records"] == 12 and fields["source.web.num_records"] == 40
    assert fields["mix.weights"] == "code:3/10,web:7/10"
    assert json.loads(json.dumps(fields)) == fields


def test_mix_inspect_reports_offset_in_mixture_epoch():
    """`resumeloader inspect` measures a mixture's epoch by its records_per_epoch."""
    loader = _loader(mixed().batch(4))
    loader.advance(12)  # 10 batches in epoch 0 (39 records), then 2 of 4
    lines = dict(inspect.describe(loader.get_state()))
    assert lines["epoch"] == "1"
    assert lines["offset in epoch"] == "8 of 39 records (all shards)"
    assert lines["position"] == "47 records (all shards)"


# -- across processes: SIGKILL and resume through `resumeloader verify` ---------------------
@pytest.mark.slow
def test_mix_verify_sigkill_70_30_mixture_reports_identical(tmp_path, capsys):
    """The 70/30 mixture job killed with SIGKILL twice resumes identically (one kill mid-save)."""
    argv = [
        "verify",
        "--workdir",
        str(tmp_path / "verify"),
        "--kill-at",
        "step:7",
        "--kill-at",
        "save:30",
        "--",
        sys.executable,
        str(SCRIPT),
    ]
    status = cli.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "IDENTICAL: same batches, same order, same bytes, same final weights" in out
