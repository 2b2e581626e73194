"""Pipeline.pack: sequences packed first-fit decreasing into rows of L, exact on resume."""

from __future__ import annotations

import _windowed as w
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import (
    ElasticResumeError,
    Pipeline,
    RecordSpecError,
    ResumableLoader,
    Shard,
    StreamIntegrityError,
    Workers,
)
from resumeloader.stages.batching import pack

pytestmark = pytest.mark.usefixtures("clean_keras")

LENGTHS = w.lengths(90, seed=1)


def _pipeline(seed: int = 0, **kwargs) -> Pipeline:
    options = {"window": 30, "batch_size": 3}
    options.update(kwargs)
    return Pipeline(w.tokens(LENGTHS), seed=seed).shuffle().pack(64, **options)


def _stream(loader) -> list[tuple[bytes, int]]:
    return [(b["tokens"].numpy().tobytes(), loader.position) for b in loader]


def _segments(batch: dict, key: str | None = None) -> list[list[int]]:
    """The records of a packed batch, each as its tokens (read back by segment id)."""
    names = ("tokens", "segment_ids", "positions") if key is None else (
        key, f"{key}_segment_ids", f"{key}_positions")
    tokens, ids, positions = (np.asarray(batch[name]) for name in names)
    records = []
    for row_tokens, row_ids, row_positions in zip(tokens, ids, positions, strict=True):
        for segment in range(1, int(row_ids.max(initial=0)) + 1):
            at = row_ids == segment
            assert row_positions[at].tolist() == list(range(int(at.sum())))
            records.append(row_tokens[at].tolist())
    return records


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 32), min_size=1, max_size=80),
    capacity=st.integers(32, 80),
    rows=st.integers(1, 5),
    seed=st.integers(0, 2**64 - 1),
)
def test_property_pack_window_holds_every_record_once_in_rows_of_l(lengths, capacity, rows, seed):
    """Every record of a window is in exactly one packed row, whole; rows never exceed L;
    segment ids run 1..k per row and positions 0..len-1 per segment; padding is 0."""
    stage = pack.PackStage(capacity, window=len(lengths), batch_size=rows, pad_value=-1)
    columns = [w.tokens(lengths)]
    groups = stage.group(columns, w.TOKENS, seed=seed, epoch=3, window=2)
    seen = []
    for group in groups:
        batch = dict(zip(("positions", "segment_ids", "tokens"),
                         stage.assemble_group(columns, w.TOKENS, group), strict=True))
        assert batch["tokens"].shape == (rows, capacity)
        padding = batch["segment_ids"] == 0
        assert (batch["tokens"][padding] == -1).all() and (batch["positions"][padding] == 0).all()
        for row in batch["segment_ids"]:
            used = row[row > 0]
            assert used.tolist() == sorted(used.tolist())  # segments one after the other
            assert set(used.tolist()) == set(range(1, int(row.max(initial=0)) + 1))
        seen += _segments(batch)
    assert sorted(seen) == sorted(t.tolist() for t in columns[0])
    assert sum(g.count for g in groups) == len(lengths)


def test_pack_batches_follow_t5_layout():
    """Records packed longest first into the first row with room, rows in the seeded order;
    segment ids and positions as T5 lays them out."""
    loader = ResumableLoader.from_pipeline(
        Pipeline(w.tokens([3, 2, 4, 1]), seed=0).pack(5, window=4, batch_size=2)
    )
    batch = next(iter(loader))
    assert {k: v.numpy().tolist() for k, v in batch.items()} == {
        "tokens": [[1000, 1001, 1002, 2000, 2001], [3000, 3001, 3002, 3003, 4000]],
        "segment_ids": [[1, 1, 1, 2, 2], [1, 1, 1, 1, 2]],
        "positions": [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]],
    }
    assert loader.position == 4


def test_pack_dict_records_pack_each_leaf_with_its_own_length():
    """inputs and targets pack side by side, each into its own row length, segments aligned."""
    data = {"inputs": w.tokens([5, 2, 7, 3]), "targets": w.tokens([1, 4, 2, 2])}
    pipeline = Pipeline(data, seed=0).pack({"inputs": 10, "targets": 6}, window=4, batch_size=2)
    batches = list(ResumableLoader.from_pipeline(pipeline, num_epochs=1))
    assert sorted(batches[0]) == [
        "inputs", "inputs_positions", "inputs_segment_ids",
        "targets", "targets_positions", "targets_segment_ids",
    ]
    assert batches[0]["inputs"].shape == (2, 10) and batches[0]["targets"].shape == (2, 6)
    for batch in batches:
        ids = np.asarray(batch["inputs_segment_ids"])
        pairs = zip(batch["inputs"], batch["targets"], strict=True)
        for row, (inputs, targets) in enumerate(pairs):
            for segment in range(1, int(ids[row].max(initial=0)) + 1):
                source = w.record_of(int(inputs.numpy()[ids[row] == segment][0]))
                got = targets.numpy()[np.asarray(batch["targets_segment_ids"])[row] == segment]
                assert got.tolist() == data["targets"][source].tolist()


def test_pack_last_batch_of_window_filled_with_empty_rows():
    """Every batch has batch_size rows; the window's last one ends in empty rows."""
    loader = ResumableLoader.from_pipeline(
        Pipeline(w.tokens([4] * 5), seed=0).pack(4, window=5, batch_size=2), num_epochs=1
    )
    batches = list(loader)
    assert [b["tokens"].shape.as_list() for b in batches] == [[2, 4]] * 3
    assert np.asarray(batches[-1]["segment_ids"]).tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]


def test_pack_position_counts_records_of_each_batch():
    """After each batch the position is the window start plus the records packed so far."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    ends = []
    total = 0
    for batch in loader:
        total += len(_segments(batch))
        ends.append(loader.position)
        assert loader.position == total
    assert ends[-1] == len(LENGTHS)


@pytest.mark.parametrize("workers", [
    {"workers": Workers(2, kind="thread")},
    {"workers": Workers(2, kind="process")},
], ids=["threads", "processes"])
def test_pack_workers_give_the_same_stream(workers):
    """Thread and process workers deliver the same bytes and positions as none."""
    reference = _stream(ResumableLoader.from_pipeline(_pipeline(), num_epochs=2))
    with ResumableLoader.from_pipeline(_pipeline(), num_epochs=2, **workers) as loader:
        assert _stream(loader) == reference


@pytest.mark.parametrize("what", ["len", "batches_per_epoch", "step"])
def test_pack_batch_counts_not_known_in_advance_raise(what):
    """len(), batches_per_epoch and step raise TypeError: the count depends on the data."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    with pytest.raises(TypeError, match="not known in advance") as info:
        len(loader) if what == "len" else getattr(loader, what)
    assert "rest_of_epoch=True" in str(info.value)


def test_pack_dataset_cardinality_unknown():
    """dataset() of a finite packing loader has unknown cardinality (not a wrong number)."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    assert loader.dataset().cardinality().numpy() == tf.data.UNKNOWN_CARDINALITY


def test_pack_dataset_eager_advance_follows_produced_batches():
    """dataset() + advance() lands where `for batch in loader` does, batch after batch."""
    reference = [p for _, p in _stream(ResumableLoader.from_pipeline(_pipeline(), num_epochs=1))]
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    positions = []
    for _ in loader.dataset():
        loader.advance()
        positions.append(loader.position)
    assert positions == reference


def test_pack_graph_advance_uses_host_callback_exactly():
    """advance() inside a tf.function lands on each batch's end (read on the host)."""
    reference = [p for _, p in _stream(ResumableLoader.from_pipeline(_pipeline(), num_epochs=1))]
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    iterator = iter(loader.dataset())

    @tf.function
    def step():
        next(iterator)
        loader.advance()

    positions = []
    for _ in reference:
        step()
        positions.append(loader.position)
    assert positions == reference


def test_pack_advance_before_iterating_raises():
    """Skipping batches of unknown size without producing them is refused, with the way out."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    with pytest.raises(StreamIntegrityError, match="none produced a batch at this") as info:
        loader.advance(2)
    assert loader.position == 0 and "restore a checkpoint" in str(info.value)


def test_pack_advance_past_produced_batches_raises():
    """An advance past what the dataset() iteration produced raises and keeps the position."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, prefetch=None)
    iterator = iter(loader.dataset().unguarded())
    next(iterator)
    with pytest.raises(StreamIntegrityError, match="advanced past the last batch"):
        loader.advance(1000)
    assert loader.position == 0


def test_pack_record_longer_than_row_raises_naming_it():
    """A record longer than L is a RecordSpecError naming its index, epoch and position."""
    pipeline = Pipeline(w.tokens([3, 9, 2]), seed=0).pack(8, window=3, batch_size=1)
    with pytest.raises(RecordSpecError, match=r"Record index 1 \(epoch 0, position 1\)") as info:
        next(iter(ResumableLoader.from_pipeline(pipeline)))
    assert "longer than a packed row of [8]" in str(info.value)
    assert info.value.record_index == 1


@pytest.mark.parametrize(
    "data",
    [{"tokens": w.tokens([2, 3]), "label": [0, 1]}, [np.float32(1)] * 2, ["ab", "c"]],
    ids=["scalar-leaf", "scalar-records", "strings"],
)
def test_pack_records_that_are_not_sequences_raise(data):
    """Only numeric sequences pack: the error names what is not one."""
    with pytest.raises(ValueError, match="pack\\(\\) packs sequences") as info:
        ResumableLoader.from_pipeline(Pipeline(data, seed=0).pack(8, window=2, batch_size=1))
    assert "output_signature" in str(info.value)


def test_pack_state_order_fields_refuse_other_row_length():
    """Length, window and rows per batch are order fields: another one is refused."""
    saved = ResumableLoader.from_pipeline(_pipeline()).get_state()
    assert {saved[f"pack.{k}"] for k in ("length", "window", "batch_size")} == {"64", 30, 3}
    other = ResumableLoader.from_pipeline(_pipeline(window=60))
    with pytest.raises(ValueError, match=r"pack\.window: checkpoint has 30, this loader has 60"):
        other.set_state(saved)
    assert other.position == 0


def test_pack_restore_between_batches_of_a_window_raises_in_set_state():
    """A position that is not a batch boundary of its window (an edited state) is refused by
    set_state, before anything changes (0.2.0 accepted it and raised at the first batch)."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    iterator = iter(loader)
    next(iterator)
    state = loader.get_state()
    iterator.close()
    resumed = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    with pytest.raises(ElasticResumeError, match="lies inside a batch") as info:
        resumed.set_state(dict(state, offset=state["offset"] - 1))
    assert f"position {state['offset'] - 1}" in str(info.value)
    assert resumed.position == 0
    resumed.set_state(state)  # a batch boundary inside the window is accepted
    assert resumed.position == state["offset"]


def test_pack_other_shard_count_inside_window_raises():
    """A state inside a window cannot continue with another shard count (other windows)."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    iterator = iter(loader)
    next(iterator)
    state = loader.get_state()
    iterator.close()
    sharded = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, shard=Shard(0, 2))
    with pytest.raises(ElasticResumeError, match="inside a window with another shard count"):
        sharded.set_state(dict(state, offset=state["offset"] + state["offset"] % 2))
    assert sharded.position == 0


def test_pack_other_shard_count_at_window_boundary_continues_without_loss():
    """From a window boundary, two shards together pack exactly the records left."""
    single = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    for _ in single:
        if single.position >= 60:
            break
    state = single.get_state()
    assert state["offset"] == 60  # 30 into each shard's stream: a window boundary
    records = []
    for shard in range(2):
        loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1, shard=Shard(shard, 2))
        loader.set_state(state)
        records += [w.record_of(r[0]) for b in loader for r in _segments(b)]
    order = single.plan.indices(0, 0, len(LENGTHS)).tolist()
    assert sorted(records) == sorted(order[60:])


def test_pack_dataset_input_context_refused():
    """Distributed input cannot split packed windows exactly: refused, naming the way out."""
    loader = ResumableLoader.from_pipeline(_pipeline())
    with pytest.raises(ValueError, match="windowed batch stage") as info:
        loader.dataset(input_context=tf.distribute.InputContext(2, 0, 2))
    assert "experimental_distribute_dataset" in str(info.value)


def test_pack_metadata_names_each_row_first_record():
    """with_metadata gives per row the index and position of its first record (-1: empty)."""
    loader = ResumableLoader.from_pipeline(
        Pipeline(w.tokens([4] * 5), seed=0).pack(4, window=5, batch_size=2),
        num_epochs=1, with_metadata=True,
    )
    rows = []
    for batch, meta in loader:
        firsts = [w.record_of(t) if s else -1 for t, s in zip(
            batch["tokens"].numpy()[:, 0], batch["segment_ids"].numpy()[:, 0], strict=True)]
        assert meta["index"].numpy().tolist() == firsts
        assert meta["position"].numpy().tolist() == firsts  # unshuffled: position == index
        rows += firsts
    assert sorted(rows) == [-1, 0, 1, 2, 3, 4]


def _row_lengths(batch, seeds):
    lengths = tf.reduce_sum(tf.cast(batch["segment_ids"] > 0, tf.int64), axis=1)
    return lengths + seeds[:, 1] * 0


def test_pack_tf_map_for_loop_counts_like_dataset():
    """With a tensor stage, `for batch in loader` (via tf.data) counts each batch's records."""
    pipeline = _pipeline().tf_map(_row_lengths)
    reference = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    expected = []
    for batch in reference.dataset():
        reference.advance()
        expected.append((batch.numpy().tolist(), reference.position))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    got = [(batch.numpy().tolist(), loader.position) for batch in loader]
    assert got == expected and got[-1][1] == len(LENGTHS)
