"""IndexableSource: any len() + __getitem__ object; __getitems__ sources read by batch; a
list of arrays of varying shape is a ragged source."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader import RecordSpecError, ResumableLoader, StateMismatchError
from resumeloader.sources import IndexableSource, adapt


class BatchedRecords:
    """A tfds-style data source: `__getitems__` returns a list of records; counts calls."""

    def __init__(self, num_records: int) -> None:
        self.num_records = num_records
        self.batch_calls: list[list[int]] = []
        self.item_calls = 0

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> dict[str, object]:
        self.item_calls += 1
        return {"id": np.int64(index), "text": f"row {index}"}

    def __getitems__(self, indices: list[int]) -> list[dict[str, object]]:
        self.batch_calls.append(list(indices))
        return [{"id": np.int64(i), "text": f"row {i}"} for i in indices]


@pytest.mark.parametrize("map_fn", [None, lambda record, rng: record], ids=["no-map_fn", "map_fn"])
def test_loader_getitems_source_reads_each_batch_in_one_call(map_fn):
    """A source with __getitems__ is read once per batch (after the spec probe)."""
    source = BatchedRecords(10)
    loader = ResumableLoader(
        source, batch_size=4, seed=1, num_epochs=1, prefetch=None, map_fn=map_fn
    )
    probes = source.item_calls

    batches = list(loader)

    assert source.item_calls == probes == 1  # record 0, read once for the element spec
    assert [len(call) for call in source.batch_calls] == [4, 4, 2]
    ids = [i for b in batches for i in b["id"].numpy().tolist()]
    assert [i for call in source.batch_calls for i in call] == ids
    assert [t for b in batches for t in b["text"].numpy().tolist()] == [
        f"row {i}".encode() for i in ids
    ]


def test_loader_getitems_source_wrong_count_raises_record_error():
    """__getitems__ returning fewer records than asked is an error naming the batch."""

    class Short(BatchedRecords):
        def __getitems__(self, indices):
            return super().__getitems__(indices)[:-1]

    loader = ResumableLoader(Short(10), batch_size=4, seed=0, shuffle=False)

    with pytest.raises(RuntimeError) as info:
        next(iter(loader))

    assert "returned 3 records for the 4 records starting at record index 0" in str(info.value)


def test_adapt_list_of_arrays_of_varying_length_is_ragged():
    """The spec of a list of arrays covers all of them: None where lengths differ."""
    source = adapt([np.zeros((2, 3)), np.zeros((5, 3))])

    assert isinstance(source, IndexableSource)
    assert source.record_spec().leaves[0].shape == (None, 3)


def test_loader_object_array_of_arrays_yields_ragged_batches():
    """An object array holding arrays of different lengths is a ragged column."""
    column = np.empty(3, dtype=object)
    column[:] = [np.arange(2), np.arange(0), np.arange(3)]
    loader = ResumableLoader(column, batch_size=3, seed=0, shuffle=False)

    assert next(iter(loader)).to_list() == [[0, 1], [], [0, 1, 2]]


def test_loader_object_leaf_of_other_objects_raises_spec_error_naming_type():
    """A record leaf that is an object array of non-strings is named, not an AttributeError."""
    records = [np.array([{"a": 1}], dtype=object)] * 2

    with pytest.raises(TypeError) as info:
        ResumableLoader(records, batch_size=2, seed=0)

    assert "object array holding a dict" in str(info.value)


def test_loader_record_not_matching_list_spec_raises_spec_error():
    """A record of another structure than record 0 in a list source is refused by name."""
    loader = ResumableLoader(
        [np.zeros(2), np.zeros(2), {"x": 1}], batch_size=3, seed=0, shuffle=False
    )

    with pytest.raises(RecordSpecError) as info:
        next(iter(loader))

    assert "Record index 2 (epoch 0, position 2)" in str(info.value)
    assert "its structure differs ({x: *})" in str(info.value)


# -- identity ---------------------------------------------------------------------------


class Versioned:
    """A user source with the optional identity hook."""

    def __init__(self, version: object, offset: int = 0) -> None:
        self.version, self.offset = version, offset

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> np.ndarray:
        return np.int64(index + self.offset)

    def identity(self) -> object:
        return self.version


class Unversioned(Versioned):
    identity = None  # type: ignore[assignment]


def test_loader_restore_with_other_user_identity_refused_naming_it():
    """A user source's identity() enters the state: another identity is refused."""
    state = ResumableLoader(Versioned("table@v1"), batch_size=4, seed=0).get_state()

    with pytest.raises(StateMismatchError) as info:
        ResumableLoader(Versioned("table@v2", 100), batch_size=4, seed=0).set_state(state)

    assert "source.identity: checkpoint has 'table@v1', this loader has 'table@v2'" in str(
        info.value
    )


def test_loader_user_source_without_identity_checks_only_length():
    """Without the hook only the length identifies a user source (the documented limit)."""
    state = ResumableLoader(Unversioned(None), batch_size=4, seed=0).get_state()
    other = ResumableLoader(Unversioned(None, 100), batch_size=4, seed=0)

    other.set_state(state)

    assert "source.identity" not in state
    assert other.position == 0


def test_user_identity_of_wrong_type_refused_naming_it():
    """identity() must return a str or an int."""
    with pytest.raises(TypeError, match=r"Versioned.identity\(\)` must return a str or an int"):
        adapt(Versioned(3.5))
