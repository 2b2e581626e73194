"""The per-stage counters (`core/meters.py`): per batch, sampled, per place, merged."""

from __future__ import annotations

import json
import threading
import time

import pytest

from resumeloader.core import board as board_lib
from resumeloader.core import meters, stats


def _stage(board: board_lib.Board, name: str) -> stats.Stage:
    stage = stats.Stats.of(board.snapshot()).stage(name)
    assert stage is not None
    return stage


def test_lap_closes_each_stage_with_its_records_bytes_and_time():
    """A timed lap adds its batch, records, bytes and the time since the last boundary."""
    place = meters.Place("here", every=1)
    lap = place.lap("produce", 128)
    assert lap is not None
    time.sleep(0.002)
    lap.lap(place["read"], 128, 4096)
    lap.lap(place["batch"], 128, 8192, out=2)
    read, batch = place["read"], place["batch"]
    assert (read.batches, read.records_in, read.records_out, read.bytes_out) == (1, 128, 128, 4096)
    assert (batch.records_in, batch.records_out, batch.bytes_out) == (128, 2, 8192)
    assert read.wall_ns >= 2_000_000  # at least the sleep


def test_one_lap_in_every_is_timed_from_the_second_on():
    """Laps 2, 2 + every, ... return a `Lap` (the first carries start-up costs); the others
    are only counted."""
    place = meters.Place("here", every=4)
    timed = [place.lap("produce", 10) is not None for _ in range(10)]
    assert timed == [False, True, False, False, False, True, False, False, False, True]
    kind = place.kinds["produce"]
    assert (kind.laps, kind.timed, kind.records, kind.timed_records) == (10, 3, 100, 30)


def test_every_lap_is_timed_with_every_1():
    """With every=1 (RESUMELOADER_STATS=all) the first lap is timed too."""
    place = meters.Place("here", every=1)
    assert all(place.lap("produce", 1) is not None for _ in range(3))


def test_stats_scale_timed_laps_to_exact_batches_and_records():
    """Batches and records are exact although only one lap in `every` is timed."""
    board = board_lib.Board(["read"], every=4)
    place = board.here()
    for size in [8] * 10 + [3]:
        lap = place.lap("produce", size)
        if lap is not None:
            lap.lap(place["read"], size)
    read = _stage(board, "read")
    assert (read.batches, read.records_in) == (11, 83)


def test_environment_variable_all_times_every_lap(monkeypatch):
    """RESUMELOADER_STATS=all: every lap is timed; unset: one in EVERY."""
    monkeypatch.setenv(meters.ENV, "all")
    assert meters.every() == 1 and board_lib.Board().every == 1
    monkeypatch.delenv(meters.ENV)
    assert meters.every() == meters.EVERY


def test_cpu_time_is_read_on_some_timed_laps_and_kept_beside_their_wall():
    """CPU time is read on one timed lap in CPU_EVERY; the wall of those laps is kept too."""
    place = meters.Place("here", every=1)
    for _ in range(2 * meters.CPU_EVERY):
        lap = place.lap("produce", 1)
        assert lap is not None
        sum(range(1000))
        lap.lap(place["read"], 1)
    read = place["read"]
    assert read.batches == 2 * meters.CPU_EVERY
    assert 0 < read.cpu_wall_ns < read.wall_ns


def test_split_divides_a_loop_in_proportion_to_the_sampled_times():
    """A record loop's time goes to its stages in proportion to their sampled times."""
    place = meters.Place("here", every=1)
    lap = place.lap("produce", 64)
    assert lap is not None
    time.sleep(0.001)
    lap.split([(place["read"], 3_000), (place["map_fn"], 1_000)], 64)
    read, mapped = place["read"], place["map_fn"]
    total = read.wall_ns + mapped.wall_ns
    assert abs(read.wall_ns - 3 * total // 4) <= 1
    assert read.records_in == mapped.records_in == 64


def test_loop_shares_are_kept_until_a_sampled_loop_adds_to_them():
    """A record loop's meters and shares are made once and made again when shares grow."""
    place = meters.Place("here", every=1)
    loop = ("read", "map_fn", "check")
    place.add_shares({"read": 1_000, "map_fn": 3_000})
    first = place.loop_shares(loop)
    assert place.loop_shares(loop) is first
    assert [(meter, ns) for meter, ns in first] == [
        (place["read"], 1_000), (place["map_fn"], 3_000), (place["check"], 0)]
    place.add_shares({"read": 2_000})
    assert [ns for _, ns in place.loop_shares(loop)] == [3_000, 3_000, 0]
    lap = place.lap("produce", 8)
    assert lap is not None
    time.sleep(0.001)
    lap.split(place.loop_shares(loop), 8)
    assert abs(place["read"].wall_ns - place["map_fn"].wall_ns) <= 1
    assert place["check"].wall_ns == 0 and place["check"].batches == 1


def test_split_of_a_lap_that_reads_cpu_divides_its_cpu_time_too():
    """On a lap that reads CPU time (the first), split divides it like the wall time."""
    place = meters.Place("here", every=1)
    lap = place.lap("produce", 16)
    assert lap is not None and lap.sampled
    sum(range(20_000))
    lap.split([(place["read"], 1), (place["map_fn"], 1)], 16)
    read, mapped = place["read"], place["map_fn"]
    assert read.cpu_wall_ns == read.wall_ns > 0 and mapped.cpu_wall_ns == mapped.wall_ns
    assert abs(read.cpu_ns - mapped.cpu_ns) <= 1 and read.cpu_ns + mapped.cpu_ns > 0


def test_take_sends_only_what_changed_since_the_last_take():
    """`take` is a delta: a second take without new batches carries no stage."""
    place = meters.Place("process worker 0", every=1)
    place.lap("produce", 10).lap(place["read"], 10, 100)  # type: ignore[union-attr]
    name, alive, cpu, first = place.take()
    assert name == "process worker 0" and alive > 0 and cpu > 0
    kind, values = first["stages"]["read"]
    assert kind == "produce" and values[:4] == (1, 10, 10, 100)
    # laps, timed laps, records, timed records, batches, timed batches
    assert first["kinds"]["produce"] == (1, 1, 10, 10, 1, 1)
    assert place.take()[3] == {"stages": {}, "kinds": {}}


def test_board_merges_deltas_of_places_elsewhere_under_their_names():
    """Deltas of two worker processes add up under each one's name; counts add up too."""
    board = board_lib.Board(["read"])
    for index in range(2):
        remote = meters.Place("MainThread", every=2)
        for _ in range(3):
            lap = remote.lap("produce", 4)
            if lap is not None:
                lap.lap(remote["read"], 4)
        board.merge(remote.take(), {"storage.gets": 2}, name=f"process worker {index}")
        board.merge(remote.take(), name=f"process worker {index}")
    snapshot = board.snapshot()
    assert sorted(p["name"] for p in snapshot["places"]) == ["process worker 0",
                                                              "process worker 1"]
    assert snapshot["counts"] == {"storage.gets": 4}
    read = _stage(board, "read")
    assert (read.batches, read.records_in, read.where) == (6, 24, "2 process workers")
    json.dumps(snapshot)


def test_each_worker_thread_counts_into_its_own_place():
    """Worker threads never share a place: two threads' laps land in two places, none lost."""
    board = board_lib.Board(every=1)

    def work() -> None:
        place = board.here()
        for _ in range(1000):
            place.lap("produce", 1).lap(place["read"], 1)  # type: ignore[union-attr]

    threads = [threading.Thread(target=work, name=f"resumeloader-worker-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    places = board.snapshot()["places"]
    assert sorted(p["name"] for p in places) == ["resumeloader-worker-0", "resumeloader-worker-1"]
    assert [p["stages"]["read"]["batches"] for p in places] == [1000, 1000]


def test_other_threads_share_the_hand_out_place():
    """Threads that are not worker threads (tf.data's, a prefetch thread) count in one place."""
    board = board_lib.Board()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(board.here()), name="tf_data_thread")
    thread.start()
    thread.join()
    assert seen == [board.here()] and board.here().name == meters.HAND_OUT


def test_watched_counts_report_only_what_grew_after_registration():
    """A process counter read at registration is the baseline of the board's counts."""
    source = {"gets": 5, "bytes": 100}
    board = board_lib.Board()
    board.watch_counts(lambda: dict(source), "storage")
    source["gets"] += 3
    assert board.snapshot()["counts"] == {"storage.gets": 3}


def test_consumer_times_asked_and_got_steps():
    """`handed` counts a step's wait, and the time between steps as the consumer's."""
    consumer = board_lib.Consumer()
    consumer.handed(100, 150)
    consumer.handed(400, 420)
    assert (consumer.steps, consumer.wait_ns, consumer.max_wait_ns) == (2, 70, 50)
    assert consumer.compute_ns == 400 - 150


def test_consumer_matches_advances_to_the_batches_produced():
    """An eager advance to a batch's end counts one step; an unknown end counts none."""
    consumer = board_lib.Consumer()
    consumer.started()
    consumer.produced(4)
    consumer.produced(8)
    consumer.advanced(4)
    consumer.advanced(8)
    assert consumer.steps == 2
    consumer.advanced(100)  # never produced (e.g. a graph advance's batches)
    assert consumer.steps == 2


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("all", True),
                                       ("", True)], ids=["0", "off", "1", "all", "empty"])
def test_enabled_follows_the_environment_variable(monkeypatch, value, on):
    """RESUMELOADER_STATS=0/off switches counting off; anything else leaves it on."""
    monkeypatch.setenv(meters.ENV, value)
    assert meters.enabled() is on


def test_chunks_are_timed_one_in_every_and_counted_as_their_batches():
    """`chunk` times chunks 2, 2 + every, ...; `laps` counts a chunk of n batches as n
    laps, all timed laps when the chunk was timed."""
    place = meters.Place("here", every=4)
    sizes = [1, 2, 4, 8, 8, 8, 8, 8, 8, 3]
    timed = []
    for size in sizes:
        lap = place.chunk("produce")
        place.laps("produce", 5 * size, size, lap)
        timed.append(lap is not None)
    assert timed == [False, True, False, False, False, True, False, False, False, True]
    kind = place.kinds["produce"]
    assert (kind.laps, kind.batches, kind.records) == (58, 58, 290)
    assert (kind.timed, kind.timed_batches, kind.timed_records) == (13, 13, 65)


def test_stats_of_growing_chunks_are_exact_in_batches_and_records():
    """Chunks of growing sizes, one in `every` timed: the stage's batches and records are
    exact and its time is the timed chunks' scaled by batches."""
    board = board_lib.Board(["read"], every=2)
    place = board.here()
    for size in [1, 2, 4, 8, 16, 32, 32, 7]:
        lap = place.chunk("produce")
        if lap is not None:
            lap.lap(place["read"], 4 * size, batches=size)
        place.laps("produce", 4 * size, size, lap)
    read = _stage(board, "read")
    assert (read.batches, read.records_in) == (102, 408)
    assert read.wall_s > 0


def test_board_times_every_consumer_step_with_every_1_and_fewer_steps_than_laps_else():
    """RESUMELOADER_STATS=all (every 1) times every step of an eager loop; otherwise the
    consumer times one step in `STEP_FACTOR` x `every`."""
    assert board_lib.Board(every=1).consumer.every == 1
    assert board_lib.Board(every=8).consumer.every == 8 * meters.STEP_FACTOR


@pytest.mark.parametrize("every", [1, 4], ids=["all", "one-in-4"])
def test_a_loop_counting_on_its_kind_counts_and_times_as_lap_does(every):
    """A loop that adds each lap to `Place.kind` itself and asks `Place.timing` once a
    lap's number reaches ``due`` counts and times the laps `Place.lap` would."""
    sizes = [5, 3, 8, 8, 1, 7, 2, 9, 4, 6, 3]
    by_lap, inline = meters.Place("a", every=every), meters.Place("b", every=every)
    timed_by_lap = [by_lap.lap("produce", n) is not None for n in sizes]
    kind, timed_inline = inline.kind("produce"), []
    for n in sizes:
        kind.laps += 1
        kind.records += n
        kind.batches += 1
        timed_inline.append(kind.laps >= kind.due and inline.timing(kind, n) is not None)
    assert timed_inline == timed_by_lap
    assert kind.values() == by_lap.kinds["produce"].values()


def test_timed_adds_a_loops_own_wall_time_to_the_meter_of_its_kind():
    """`Place.timed`: the lap just counted was timed whole; its wall time, batch and
    records go to the meter of the kind's name, and the next timed lap is `every` on."""
    board = board_lib.Board(["sampler"], every=2)
    place = board.here()
    kind = place.kind("sampler")
    for number in range(1, 7):
        kind.laps += 1
        kind.records += 3
        kind.batches += 1
        if kind.laps >= kind.due:
            place.timed(kind, 3, 1_000 * number)
    assert (kind.laps, kind.timed, kind.records, kind.timed_records) == (6, 3, 18, 9)
    meter = place["sampler"]
    assert (meter.batches, meter.records_in, meter.wall_ns) == (3, 9, 2_000 + 4_000 + 6_000)
    sampler = _stage(board, "sampler")
    assert (sampler.batches, sampler.records_in) == (6, 18)
