"""The per-stage counters (`core/meters.py`): per batch, per place, merged across processes."""

from __future__ import annotations

import json
import threading
import time

import pytest

from resumeloader.core import meters


def test_lap_closes_each_stage_with_its_records_bytes_and_time():
    """Each lap adds one batch, its records and bytes, and the time since the last boundary."""
    place = meters.Place("here")
    lap = place.lap()
    time.sleep(0.002)
    lap.lap(place["read"], 128, 4096)
    lap.lap(place["batch"], 128, 8192, out=2)
    read, batch = place["read"], place["batch"]
    assert (read.batches, read.records_in, read.records_out, read.bytes_out) == (1, 128, 128, 4096)
    assert (batch.records_in, batch.records_out, batch.bytes_out) == (128, 2, 8192)
    assert read.wall_ns >= 2_000_000  # at least the sleep


def test_cpu_time_is_read_on_the_first_batch_and_then_one_in_cpu_every():
    """CPU time is sampled on batches 1, 1 + CPU_EVERY, ...; the sampled wall is kept beside."""
    place = meters.Place("here")
    for _ in range(2 * meters.CPU_EVERY):
        place.lap().lap(place["read"], 1)
    read = place["read"]
    assert read.batches == 2 * meters.CPU_EVERY
    assert 0 < read.cpu_wall_ns <= read.wall_ns


def test_split_divides_a_loop_in_proportion_to_the_sampled_times():
    """A record loop's time goes to its stages in proportion to their sampled times."""
    place = meters.Place("here")
    lap = place.lap()
    time.sleep(0.001)
    lap.split([(place["read"], 3_000), (place["map_fn"], 1_000)], 64)
    read, mapped = place["read"], place["map_fn"]
    total = read.wall_ns + mapped.wall_ns
    assert abs(read.wall_ns - 3 * total // 4) <= 1
    assert read.records_in == mapped.records_in == 64


def test_take_sends_only_what_changed_since_the_last_take():
    """`take` is a delta: a second take without new batches carries no stage."""
    place = meters.Place("process worker 0")
    place.lap().lap(place["read"], 10, 100)
    name, alive, cpu, first = place.take()
    assert name == "process worker 0" and alive > 0 and cpu > 0
    assert first["read"][:4] == (1, 10, 10, 100)
    assert place.take()[3] == {}
    place.lap().lap(place["read"], 5)
    assert place.take()[3]["read"][:3] == (1, 5, 5)


def test_board_merges_deltas_of_places_elsewhere_under_their_names():
    """Deltas of two worker processes add up under each one's name; counts add up too."""
    board = meters.Board(["read"])
    for index in range(2):
        remote = meters.Place(f"process worker {index}")
        for _ in range(3):
            remote.lap().lap(remote["read"], 4)
        board.merge(remote.take(), {"storage.gets": 2})
        board.merge(remote.take())
    snapshot = board.snapshot()
    workers = {p["name"]: p for p in snapshot["places"]}
    assert sorted(workers) == ["process worker 0", "process worker 1"]
    assert all(p["stages"]["read"]["records_in"] == 12 for p in workers.values())
    assert snapshot["counts"] == {"storage.gets": 4}
    json.dumps(snapshot)


def test_each_thread_counts_into_its_own_place():
    """Threads never share a place: two threads' batches land in two places, none lost."""
    board = meters.Board()

    def work() -> None:
        place = board.here()
        for _ in range(1000):
            place.lap().lap(place["read"], 1)

    threads = [threading.Thread(target=work, name=f"resumeloader-worker-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    places = board.snapshot()["places"]
    assert sorted(p["name"] for p in places) == ["resumeloader-worker-0", "resumeloader-worker-1"]
    assert [p["stages"]["read"]["batches"] for p in places] == [1000, 1000]


def test_watched_counts_report_only_what_grew_after_registration():
    """A process counter read at registration is the baseline of the board's counts."""
    source = {"gets": 5, "bytes": 100}
    board = meters.Board()
    board.watch_counts(lambda: dict(source), "storage")
    source["gets"] += 3
    assert board.snapshot()["counts"] == {"storage.gets": 3}


def test_consumer_times_asked_and_got_steps():
    """`handed` counts a step's wait, and the time between steps as the consumer's."""
    consumer = meters.Consumer()
    consumer.handed(100, 150)
    consumer.handed(400, 420)
    assert (consumer.steps, consumer.wait_ns, consumer.max_wait_ns) == (2, 70, 50)
    assert consumer.compute_ns == 400 - 150


def test_consumer_matches_advances_to_the_batches_produced():
    """An eager advance to a batch's end counts one step; an unknown end counts none."""
    consumer = meters.Consumer()
    consumer.started()
    consumer.produced(4)
    consumer.produced(8)
    consumer.advanced(4)
    consumer.advanced(8)
    assert consumer.steps == 2
    consumer.advanced(100)  # never produced (e.g. a graph advance's batches)
    assert consumer.steps == 2


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True)],
                         ids=["0", "off", "1", "empty"])
def test_enabled_follows_the_environment_variable(monkeypatch, value, on):
    """RESUMELOADER_STATS=0/off switches counting off; anything else leaves it on."""
    monkeypatch.setenv(meters.ENV, value)
    assert meters.enabled() is on


def test_timed_counts_each_item_of_an_iterator():
    """`timed` counts one batch per item, with its records."""
    place = meters.Place("here")
    items = list(meters.timed(iter([[1, 2], [3]]), lambda: place["sampler"], len))
    assert items == [[1, 2], [3]]
    assert (place["sampler"].batches, place["sampler"].records_in) == (2, 3)
