"""`Stats` (`core/stats.py`): rows per stage, rates, the bottleneck, the table and the dict."""

from __future__ import annotations

import json

import pytest

from resumeloader.core import board as board_lib
from resumeloader.core import stats


def _snapshot(walls: dict[str, int], *, places: int = 1) -> dict:
    board = board_lib.Board(list(walls))
    for index in range(places):
        place = board.place(f"resumeloader-worker-{index}")
        for name, wall in walls.items():
            meter = place[name]
            meter.add((10, 1280, 1280, 1000, wall, 0, 0))
    return board.snapshot()


def test_bottleneck_is_the_stage_allowing_the_fewest_records():
    """The slowest stage per record is the bottleneck, and its rate is records / wall."""
    value = stats.Stats.of(_snapshot({"sampler": 10**6, "read": 10**8, "map_fn": 10**7}))
    assert value.bottleneck == "read"
    read = value.stage("read")
    assert read is not None and read.allows == 1280 / 0.1


def test_places_multiply_what_a_stage_allows():
    """A stage run by two thread workers allows twice its records per wall second."""
    value = stats.Stats.of(_snapshot({"read": 10**8}, places=2))
    read = value.stage("read")
    assert read is not None
    assert read.where == "2 thread workers" and read.places == 2
    assert read.allows == 2 * 2560 / 0.2


def test_rows_follow_the_chain_order():
    """Rows come in the board's chain order, whatever order the places saw them."""
    value = stats.Stats.of(_snapshot({"sampler": 1, "read": 2, "batch": 3}))
    assert [s.name for s in value.stages] == ["sampler", "read", "batch"]


def test_table_names_every_stage_and_marks_the_bottleneck():
    """The table has a row per stage; the bottleneck is starred and named in the summary."""
    text = str(stats.Stats.of(_snapshot({"sampler": 10**6, "map_fn": 10**8})))
    lines = text.splitlines()
    assert "bottleneck: map_fn" in lines[0]
    assert any(line.startswith("map_fn *") for line in lines)
    assert any(line.startswith("sampler ") for line in lines)


def test_to_dict_is_json_and_carries_the_rates():
    """`to_dict` is plain JSON with each stage's rate and the bottleneck."""
    value = stats.Stats.of(_snapshot({"read": 10**7, "map_fn": 10**8}))
    data = json.loads(json.dumps(value.to_dict()))
    assert data["bottleneck"] == "map_fn"
    assert [s["name"] for s in data["stages"]] == ["read", "map_fn"]
    assert data["stages"][0]["allows"] == 1280 / 0.01


def test_empty_board_has_no_bottleneck():
    """Before any batch: no stage, no bottleneck, and the table still renders."""
    value = stats.Stats.of(board_lib.Board(["read"]).snapshot())
    assert value.bottleneck is None and value.stages == ()
    assert "0 records" in str(value)


def test_wait_share_is_the_consumers_waiting_fraction():
    """The data wait share is wait / (wait + time between batches)."""
    board = board_lib.Board()
    board.consumer.handed(0, 30)
    board.consumer.handed(100, 130)
    value = stats.Stats.of(board.snapshot())
    assert value.steps == 2 and value.wait_share == pytest.approx(60 / (60 + 70))
