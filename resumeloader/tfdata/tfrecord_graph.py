"""The ``tfrecord_graph`` path: TFRecord files or objects read by TensorFlow a window at a time.

A pipeline of nothing but a `TFRecordSource` of local files (the records' bytes), the
block order (`resumeloader.core.blocks`), fixed-size batches (tensor stages after the
batch allowed), no workers, the bad-record policy "raise" and checked checksums reads
each *window* of the order — the records of its few chunks, consecutive records of the
files — with TensorFlow's TFRecord reader (``TFRecordDatasetV2`` started at each run's
byte offset, ``take`` its count; CRC32C checked in C++) into one string tensor, and
hands out each batch as a ``tf.gather`` of the window's records in a parallel, ordered
``map`` (AUTOTUNE): no ``from_generator``, no Python per record or per batch.

Python runs once per window, in two ``numpy_function`` calls: before it is read, to
place it (`TFRecordGraphPath.window_at`: its runs of records, the positions of the
iteration it holds, the rows of its records in the plan's NumPy order, `Plan.indices`,
so the batches are the other paths' by construction, and where they cut it), and after
(`TFRecordGraphPath.check_window`), to check that the reader found every record and
that no file changed since the source was built (one ``stat`` per file of the window).
A window that fails either is read by the source (`TFRecordSource.read_batch`), which
raises the error the other paths raise, naming the file, the record and its byte
offset: TensorFlow's ``DataLossError`` says only "corrupted record at <offset>", so the
reader's errors are ignored (``ignore_errors``: the run ends there) and found by the
count. Batches are cut from the epoch's start (in the iteration's first epoch from its
position, which a state of another batch size may put between two: `_cut`), windows
from theirs: a batch that straddles windows (any number of them) is finished from the
rows a ``scan`` carries from the windows before, and it and the epoch's short last batch
are made in the scan; the whole batches of a window are each a gather of a row of its
rows. A window is read while the one before is batched (`READ_AHEAD`).

A source of objects only (``s3://``, ``gs://``, ...: `TFRecordSource.spoolable`) takes
the path too: the placing step gets the window's blocks from the span cache (the GETs
merged, retried and pinned to each object's version by
`resumeloader.sources.storage.fetch`, as for ``read_batch``) and writes its records, one
after the other, into a *spool* (`Spool`: an ``os.memfd_create`` file, Linux), which
TensorFlow's reader reads by its path ``/proc/self/fd/<fd>`` as it reads a local file,
checking framing and CRC32C. Placing a window starts the GETs of the next one
(`TFRecordSource.prefetch`, within the loader's read-ahead budget as for the
``read_batch`` path: `resumeloader.workers.readahead`), so that its bytes arrive while
this one is batched. A failed GET, a changed object or a short block reads the window
by the source, which raises its error naming the object and the record.

Local files in the global shuffle (or the natural order: the sampler's orders,
`resumeloader.stages.sampler`) take the path too. Their window is whole batches of
positions (about `WINDOW_BYTES` of records, at most `WINDOW_RECORDS`), from the
iteration's position on; placing it reads its records, sorted by file and offset,
neighbours merged, by one ``preadv`` per run into a reused buffer, written into a spool
slot by one ``pwrite`` (`TFRecordSource.spool_local`): no CRC32C call, no ``bytes`` per
record and no ``from_generator`` hand-off in Python, TensorFlow's reader checking every
record. A window that fails (a short read, a changed file, a record TensorFlow's reader
refuses) is read again batch by batch as the ``read_batch`` path reads it
(`TFRecordSource.read_packed`), which raises that path's error word for word.

The ledger sees an iteration as it sees the ``graph`` path's (`stream.Counter`): once
per window the graph checks that the iteration was not superseded and adds the window's
batches to the count. ``for batch in loader`` keeps the produced batches of the
``read_batch`` path (a Python thread), or — with tensor stages — reads this dataset.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import blocks, exiting
from resumeloader.handout import engine as engine_lib
from resumeloader.sources import tfrecord
from resumeloader.sources.storage import answers, fetch, handles
from resumeloader.stages import blocks as block_stage
from resumeloader.stages import sampler as sampler_stage
from resumeloader.tfdata import columns as columns_lib
from resumeloader.tfdata import delivery, graph, graph_batches, graph_order, graph_path
from resumeloader.workers import checks, readahead

__all__ = ["READ_AHEAD", "SPOOL_SLOTS", "Spool", "TFRecordGraphPath"]

#: Windows read and held at once: the one being batched and the next (read ahead).
READ_AHEAD = 2
#: The TFRecord reader's buffer per run of records.
BUFFER_BYTES = 1 << 20
_RECORD = tf.TensorSpec([], tf.string)
_no_autograph = tf.autograph.experimental.do_not_convert
# The int64 arrays `window_at` returns, in order (then the runs' file names, strings).
_FIELDS = ("files", "offsets", "counts", "head", "full", "tail", "carry", "head_indices",
           "full_indices", "tail_indices", "positions", "where")
#: Spool slots taken at once (windows placed, not yet checked) past which the oldest
#: taken one is reclaimed: one iteration holds one (its windows are placed, read and
#: checked one after the other); a slot stays taken only when its iteration was dropped
#: between placing and checking a window (see `Spool`).
SPOOL_SLOTS = 6
#: The global shuffle's windows (and the natural order's): whole batches of about this
#: many bytes of records, spooled (`TFRecordSource.spool_local`), and at most
#: `WINDOW_RECORDS` records (a restore reads the rest of its window before its first
#: batch).
WINDOW_BYTES = 8 << 20
WINDOW_RECORDS = 8192


class Spool:
    """The memfd files that windows of objects are written into for TensorFlow's reader
    (`TFRecordGraphPath`), reused: a pwrite over a file's pages is a plain copy, a new
    file allocates them.

    A window *takes* a slot when it is placed (`take`: a free one, else a new one) and
    gives it back when it is checked (`give_back`). A window whose iteration was dropped
    between the two (its iterator deleted mid-read: the check never runs) would keep
    its slot for ever: once `limit` are taken, the oldest taken one is reclaimed for the
    new window. That is safe for any iteration: a slot taken again gets a new token, so
    the check of the window it held (if that iteration is still alive) finds the token
    changed and refuses the records read — which TensorFlow read from a file being
    rewritten — instead of handing them out (`check`); a dropped iteration's reader
    may still read it, but nothing it reads is handed out. (TensorFlow's reader checks
    every record's CRC32C and the count finds a short read, but another window's
    records would pass both: the token is what tells.) A file is never closed while the
    spool lives: TensorFlow opens it by number (``/proc/self/fd/<fd>``), and a closed
    number is reused by the next file the process opens; a reclaimed slot is overwritten
    instead. All are closed when the spool is garbage collected (its path with it) or
    at exit. Free slots past two are emptied (``ftruncate``), so that the memory held
    is the taken windows' and two more.
    """

    def __init__(self, limit: int = SPOOL_SLOTS) -> None:
        self.limit = limit
        self._fds: list[int] = []
        self._free: list[int] = []
        self._taken: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, _close_all, self._fds)

    @staticmethod
    def available() -> bool:
        """Whether this system has memfd files readable by path (Linux)."""
        return hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")

    def take(self) -> tuple[int, int, int]:
        """A slot for a window: (slot, its token, its file descriptor)."""
        with self._lock:
            token = next(self._tokens)
            if self._free:
                slot = self._free.pop()
            elif len(self._taken) >= self.limit:
                slot, _ = self._taken.popitem(last=False)  # the oldest: see the class
            else:
                slot = len(self._fds)
                self._fds.append(os.memfd_create(f"resumeloader-spool-{slot}",
                                                 os.MFD_CLOEXEC))
            self._taken[slot] = token
            return slot, token, self._fds[slot]

    def path(self, slot: int) -> bytes:
        """The path TensorFlow's reader opens `slot`'s file by."""
        return b"/proc/self/fd/%d" % self._fds[slot]

    def give_back(self, slot: int, token: int) -> bool:
        """Gives back `slot`, taken with `token`; False (and nothing given back) when it
        was reclaimed since: its file may have been rewritten under the reader."""
        with self._lock:
            if self._taken.get(slot) != token:
                return False
            del self._taken[slot]
            if len(self._free) >= 2:
                os.ftruncate(self._fds[slot], 0)  # its pages freed, its number kept
            self._free.append(slot)
            return True

    def slots(self) -> tuple[int, int]:
        """(files open, slots taken)."""
        with self._lock:
            return len(self._fds), len(self._taken)

    def close(self) -> None:
        """Closes every file (only once no dataset of the path can run)."""
        self._closer()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


class TFRecordGraphPath(delivery.DeliveryPath):
    """TFRecord files (or objects, spooled) in the block order: each window read by
    TensorFlow's reader, each batch a gather of its window's records (see the module
    docstring)."""

    name = "tfrecord_graph"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        plan = engine.plan
        pipeline = plan.pipeline
        source, stage = pipeline.source, pipeline.index_stage
        if not (
            isinstance(source, tfrecord.TFRecordSource)
            and type(stage) in (block_stage.BlockStage, sampler_stage.SamplerStage)
            and stage.algorithm in graph_order.ALGORITHMS
            # strings read as one packed column: a plain fixed-size batch stage, no record
            # or batch map stages
            and engine.producer.reads_packed
            and not engine.backend.parallel  # workers asked for: let them make the batches
            and engine.quarantine is None  # the bad-record policy "raise"
            and plan.shard.count == 1  # a shard would read every window for a few records
            and graph_batches.GraphLayout.supports(plan.layout)
        ):
            return False
        files = source.local_files()
        mean = source.mean_record_bytes() or 0.0
        if not isinstance(stage, block_stage.BlockStage):
            # The global shuffle (or the natural order) of local files with checksums
            # checked: each window's records spooled into a memfd file.
            records = _window_records(plan.layout.batch_size, mean,
                                      plan.layout.records_per_epoch)
            return (files is not None and Spool.available()
                    and (READ_AHEAD + 1) * records * mean <= tfrecord.HELD_BYTES)
        # Local files with checksums checked (TensorFlow's reader checks them), or objects
        # only, read by blocks, with checksums checked, spooled into memfd files.
        if files is None and not (source.spoolable() and Spool.available()):
            return False
        # Windows read ahead are held whole: at most what the source holds read by blocks.
        return (READ_AHEAD + 1) * stage.chunk_records * stage.window_chunks * mean <= (
            tfrecord.HELD_BYTES)

    def __init__(self, engine: engine_lib.Engine, *, prefetch: int | None) -> None:
        super().__init__(engine, prefetch=prefetch)
        plan = engine.plan
        source = plan.pipeline.source
        assert isinstance(source, tfrecord.TFRecordSource)
        self._source = source
        #: Where local files' records lie; None for objects, spooled (`_spool`).
        self._files = source.local_files()
        self._spool: Spool | None = None
        self._names = np.zeros(0, dtype=object)
        stage = plan.pipeline.index_stage
        #: The block order; None for the global shuffle (or the natural order), whose
        #: windows of positions are spooled from local files (`_spooled_local`).
        self._order: blocks.BlockOrder | None = None
        # The buffers the local spool reads into, reused (`TFRecordSource.spool_local`).
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()
        # The last windows' records (`_records`), by (epoch, positions).
        self._recent: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if isinstance(stage, block_stage.BlockStage):
            self._order = stage.order(plan.pipeline.seed)
            self._window_records = self._order.window_records
        else:
            mean = source.mean_record_bytes() or 0.0
            self._window_records = _window_records(
                plan.layout.batch_size, mean, plan.layout.records_per_epoch)
        if self._files is None or self._order is None:
            assert self._files is not None or source.spoolable()
            self._spool = Spool()
        if self._files is not None:
            self._names = np.array(self._files.paths, dtype=object)
        # Objects' read-ahead: the next window's blocks announced when a window is
        # placed (again when it is checked if the budget was full), within the source's
        # budget, or for "auto" the one the loader chooses (as `readahead.hinted` does).
        self._budget: readahead.AutoBudget | None = None
        self._pending: np.ndarray | None = None
        if self._files is None:
            limit, cache = source.readahead()
            if limit == readahead.AUTO:
                self._budget = readahead.AutoBudget(cache_bytes=cache, memory=None,
                                                    board=engine.board)
        layout = plan.layout
        per, size = layout.records_per_epoch, layout.batch_size
        #: Positions of an epoch that batches hold (a dropped remainder left out).
        self._usable = per - per % size if layout.drop_remainder else per
        self._windows_per_epoch = -(-self._usable // self._window_records)
        self._metadata = (graph_batches.GraphBatches(plan).metadata
                          if self.finisher.seeded else None)
        # As the graph path's, a window being its chunk.
        self._count = graph_path.GraphCount()

    def begin(self, position: int, watch: delivery.Watch | None) -> int:
        """Starts an iteration at `position` (told to `watch`); returns its serial."""
        return self._count.begin(position, watch)

    # -- Python, once per window -----------------------------------------------------------
    def chunks(self, position: int, *, rest_of_epoch: bool) -> int:
        """The windows of the iteration from normalised `position` (`_Begin` asks)."""
        layout = self.engine.plan.layout
        if layout.end is not None and position >= layout.end:
            return 0
        first = self._first_windows(position)
        if rest_of_epoch:
            return first
        if layout.num_epochs is None:
            return graph_batches.ENDLESS
        later = layout.num_epochs - position // layout.records_per_epoch - 1
        return first + max(0, later) * self._windows_per_epoch

    def _cut(self, start: int, epoch: int) -> tuple[int, int]:
        """How the iteration from normalised position `start` cuts `epoch` into batches:
        where they begin (the first position of a batch, modulo the batch size) and the
        positions of the epoch they hold (`Layout`: a batch begins at the position an
        iteration starts from, any position of a state of another batch size; with
        ``drop_remainder`` the short batch left at the epoch's end is dropped)."""
        layout = self.engine.plan.layout
        per, size = layout.records_per_epoch, layout.batch_size
        first, offset = divmod(start, per)
        if epoch != first or not offset % size:
            return 0, self._usable
        usable = per - (per - offset) % size if layout.drop_remainder else per
        return offset % size, usable

    def _bounds(self, start: int, epoch: int, window: int) -> tuple[int, int]:
        """The positions ``[low, high)`` of `epoch` that window `window` gives to the
        iteration from normalised `start`."""
        per = self.engine.plan.layout.records_per_epoch
        size = self._window_records
        low = window * size
        if epoch == start // per:
            low = max(low, start % per)
        return low, min((window + 1) * size, self._cut(start, epoch)[1])

    def _first_windows(self, position: int) -> int:
        """The windows of `position`'s epoch from the one holding it."""
        offset = position % self.engine.plan.layout.records_per_epoch
        usable = self._cut(position, position // self.engine.plan.layout.records_per_epoch)[1]
        if offset >= usable:
            return 0
        return -(-usable // self._window_records) - offset // self._window_records

    def window_place(self, position: int, number: int) -> tuple[int, int, int, int]:
        """Window `number` of the iteration from normalised `position`: its epoch, its
        number in the epoch and the positions ``[low, high)`` of the epoch it gives."""
        per = self.engine.plan.layout.records_per_epoch
        size = self._window_records
        epoch, offset = divmod(position, per)
        first = self._first_windows(position)
        if number < first:
            window = offset // size + number
        else:
            later, window = divmod(number - first, self._windows_per_epoch)
            epoch += 1 + later
        return (epoch, window, *self._bounds(position, epoch, window))

    def window_at(self, position: int, number: int, serial: int, windows: int
                  ) -> list[np.ndarray]:
        """What the graph needs of window `number` of the iteration from `position` (of
        `windows`): int64 arrays, in the order of `_FIELDS`, then the runs' file names:

        * ``files``, ``offsets``, ``counts``: its runs of records (its chunks in record
          order, neighbours merged, cut at file ends): file, byte offset, records; for
          objects, one run: the window's records written into a spool slot (`_spooled`);
        * ``head``: the rows (in the window's records, read run after run) that finish
          the batch begun by the rows carried from the windows before, if it ends here;
          ``full``: the rows of its whole batches, batch after batch; ``tail``: the rows
          of the epoch's last, short batch, if it ends here; ``carry``: the rows of a
          batch it begins and does not end, carried on;
        * ``head_indices``, ``full_indices``, ``tail_indices``, ``positions``: the record
          indices of those batches (carried rows included) and each batch's position,
          for the metadata (empty when no metadata is needed);
        * ``where``: its epoch, its records, `serial`, whether it has a head and a tail
          batch, whether the rows carried in go on (no batch ends here), its batches,
          its number in its epoch, its spool slot and token (-1 for local files read
          where they lie) and the iteration's `position`.

        The rows are those of the plan's own NumPy order (`Plan.indices`).
        """
        plan = self.engine.plan
        layout = plan.layout
        size = layout.batch_size
        epoch, window, low, high = self.window_place(position, number)
        firsts, lasts = self._chunks(epoch, window, position)
        slot = token = -1
        if self._order is None:
            runs, names, slot, token = self._spooled_local(epoch, window, firsts, lasts,
                                                           position)
        elif self._files is not None:
            runs = _runs(self._files, firsts, lasts)
            names = self._names[runs[0]]
        else:
            runs, names, slot, token = self._spooled(epoch, window, firsts, lasts)
            if number + 1 < windows:
                self._announce(*self.window_place(position, number + 1)[:2])
        before = np.concatenate([[0], np.cumsum(lasts - firsts)])
        indices = (plan.indices(epoch, low, high) if self._order is not None
                   else self._records(epoch, window, position)[0])
        at = np.searchsorted(firsts, indices, side="right") - 1
        rows = before[at] + indices - firsts[at]
        phase, usable = self._cut(position, epoch)
        carried = (low - phase) % size  # rows of a batch begun in the windows before
        head = min((size - carried) % size, high - low)
        epoch_end = high == usable
        empty = rows[:0]
        has_head = bool(carried) and (carried + head == size or epoch_end)
        keep = bool(carried) and not has_head  # the batch goes on past this window
        if keep:
            head, rest = 0, empty
        else:
            rest = rows[head:]
        full = len(rest) // size * size
        left = rest[full:]
        has_tail = epoch_end and len(left) > 0
        tail, carry = (left, empty) if has_tail else (empty, rows if keep else left)
        batches = int(has_head) + full // size + int(has_tail)
        # (`refs` reads positions[0] and [-1] whatever the batches: never empty.)
        meta = [empty, empty, empty, np.zeros(1, np.int64)]
        if self._metadata is not None and batches:
            first = low - carried if has_head else low
            emitted = (carried + head if has_head else 0) + full + len(tail)
            every = plan.indices(epoch, first, first + emitted)
            cut = carried + head if has_head else 0
            sizes = ([cut] if has_head else []) + [size] * (full // size) + (
                [len(tail)] if has_tail else [])
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            meta = [every[:cut], every[cut : cut + full], every[cut + full :],
                    epoch * layout.records_per_epoch + first + starts]
        where = np.array([epoch, int(before[-1]), serial, has_head, has_tail, keep, batches,
                          window, slot, token, position], np.int64)
        return [*runs, rows[:head] if has_head else empty, rest[:full], tail, carry, *meta,
                where, names]

    def _spooled(self, epoch: int, window: int, firsts: np.ndarray, lasts: np.ndarray
                 ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray, int, int]:
        """The window's records written into a spool slot, one after the other (a
        TFRecord file of them, in record order): its one run, its file name, the slot
        and its token. A failed read (a GET, a changed object, a short block) reads the
        window by the source, which raises its error (`_read_again`)."""
        assert self._spool is not None
        slot, token, fd = self._spool.take()
        try:
            written = self._source.spool(self._source.pieces(firsts, lasts), fd)
        except (handles.StaleFileError, fetch.ObjectReadError, answers.Refusal) as err:
            self._spool.give_back(slot, token)
            self._read_again(None, epoch, window, firsts, lasts, err)
        if written is None:
            self._spool.give_back(slot, token)
            self._read_again(None, epoch, window, firsts, lasts, None)
        return (*self._spool_run(slot, firsts, lasts), slot, token)

    def _spooled_local(self, epoch: int, window: int, firsts: np.ndarray, lasts: np.ndarray,
                       start: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray],
                                            np.ndarray, int, int]:
        """`_spooled` of local files (the global shuffle): the window's records read by
        runs (`TFRecordSource.spool_local`) into a spool slot, in record order."""
        assert self._spool is not None
        slot, token, fd = self._spool.take()
        with self._lock:
            buffer = self._buffers.pop() if self._buffers else None
        try:
            written, buffer = self._source.spool_local(firsts, lasts, fd, buffer)
        except handles.StaleFileError as err:
            self._spool.give_back(slot, token)
            self._read_again(None, epoch, window, firsts, lasts, err, start=start)
        finally:
            if buffer is not None:
                with self._lock:
                    self._buffers.append(buffer)
        if written is None:
            self._spool.give_back(slot, token)
            self._read_again(None, epoch, window, firsts, lasts, None, start=start)
        return (*self._spool_run(slot, firsts, lasts), slot, token)

    def _spool_run(self, slot: int, firsts: np.ndarray, lasts: np.ndarray
                   ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        """The one run of a window written into spool `slot` (its records one after the
        other from byte 0) and the slot's file name, as `window_at` hands runs over."""
        assert self._spool is not None
        one = np.zeros(1, np.int64)
        runs = (one, one, np.array([int((lasts - firsts).sum())], np.int64))
        return runs, np.array([self._spool.path(slot)], dtype=object)

    def _announce(self, epoch: int | None = None, window: int | None = None) -> None:
        """Starts the GETs of window `window` of `epoch` (`TFRecordSource.prefetch` of a
        record of each of its blocks); when the read-ahead budget is full, they are asked
        for again when the window being read is checked (no window: that retry)."""
        if window is not None:
            assert epoch is not None
            self._pending = self._source.pieces(*self._chunks(epoch, window))[:, 0]
            if self._budget is not None:
                self._budget.after_task()
        indices = self._pending
        if indices is None:
            return
        budget = self._budget
        done = (self._source.prefetch(indices) if budget is None
                else self._source.prefetch(indices, budget=budget.bytes))
        if done:
            self._pending = None

    def _chunks(self, epoch: int, window: int, start: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
        """The first record and the record after the last of each chunk of window
        `window` of `epoch`, in record order; of the global shuffle (or the natural
        order), those of the positions it gives the iteration from `start` (`_records`)."""
        order = self._order
        if order is None:
            return self._records(epoch, window, start)[1:]
        chunks = np.sort(np.asarray(order.window_chunk_ids(epoch, window), np.int64))
        firsts = chunks * order.chunk_records
        return firsts, np.minimum(firsts + order.chunk_records, order.num_records)

    def _records(self, epoch: int, window: int, start: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The global shuffle's (or the natural order's) window `window` of `epoch`, the
        positions it gives the iteration from `start` (`_bounds`: the iteration's first
        window may begin inside it): their record indices (the plan's order,
        `Plan.indices`) and, as `_chunks` gives them, their records sorted, neighbours in
        one file merged into ranges. The last few are kept: a window is placed, then
        checked."""
        low, high = self._bounds(start, epoch, window)
        key = (epoch, low, high)
        with self._lock:
            found = self._recent.get(key)
        if found is not None:
            return found
        indices = self.engine.plan.indices(epoch, low, high)
        records = np.unique(indices)
        assert self._files is not None
        files = np.searchsorted(self._files.ends, records, side="right")
        apart = (records[1:] - records[:-1] != 1) | (files[1:] != files[:-1])
        begins = np.flatnonzero(np.concatenate([[len(records) > 0], apart]))
        ends = np.append(begins[1:], len(records))
        found = (indices, records[begins], records[ends - 1] + 1)
        with self._lock:
            self._recent[key] = found
            while len(self._recent) > 2 * (READ_AHEAD + 1):
                del self._recent[next(iter(self._recent))]
        return found

    def check_window(self, found: int, files: np.ndarray, epoch: int, window: int,
                     slot: int = -1, token: int = -1, start: int = 0) -> bool:
        """Checks that TensorFlow's reader found all the window's records (`found`) and
        that none of its `files` changed since the source was built (one ``stat``
        each), or, spooled, that its spool `slot` was not reclaimed since it was taken
        (with `token`: `Spool`) and gives it back; otherwise reads the window with the
        source, which raises its error naming the file, the record and its byte offset.

        Raises:
            RecordError: a record failed its checks (the source's error as its cause).
            RuntimeError: TensorFlow's reader failed where the source reads every record,
                or the window's spool slot was reclaimed under it.
        """
        firsts, lasts = self._chunks(epoch, window, start)
        expected = int((lasts - firsts).sum())
        if self._spool is not None:
            if not self._spool.give_back(slot, token):
                msg = (
                    f"The spool file of window {window} of epoch {epoch} was taken for "
                    f"another window while TensorFlow's reader read it: more than "
                    f"{self._spool.limit} iterations of this loader's datasets were "
                    "reading at once. Read fewer at once, or take the read_batch path "
                    "(e.g. `Workers(1)`) for this pipeline."
                )
                raise RuntimeError(msg)
            self._announce()  # the next window's blocks, if the budget was full
            if found == expected:
                return True
        elif found == expected and self._files is not None and not self._files.changed(files):
            return True
        self._read_again(found, epoch, window, firsts, lasts, None, start=start)
        return False

    def _read_again(self, found: int | None, epoch: int, window: int, firsts: np.ndarray,
                    lasts: np.ndarray, failed: BaseException | None, *, start: int = 0
                    ) -> NoReturn:
        """Reads the window with the source (after TensorFlow's reader found `found` of
        its records, or its objects' reads failed with `failed`, or a block was short),
        which raises its error naming the file, the record and its byte offset; if the
        source reads every record, raises RuntimeError.

        Raises:
            RecordError: a record failed its checks (the source's error as its cause).
            RuntimeError: the source read every record.
        """
        expected = int((lasts - firsts).sum())
        if self._order is None:
            self._read_by_batches(epoch, window, start)
        else:
            indices = np.concatenate([
                np.arange(a, b, dtype=np.int64)
                for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)])
            try:
                self._source.read_batch(indices)
            except Exception as err:
                first = (epoch * self.engine.plan.layout.records_per_epoch
                         + window * self._window_records)
                raise checks.batch_error("read_batch", err, indices, epoch, first) from err
        what = f"TensorFlow's TFRecord reader read {found} of the {expected} records"
        kind = "objects' blocks" if self._files is None else "files' runs"
        if failed is not None:
            what = (f"Reading the {kind} of the {expected} records failed "
                    f"({type(failed).__name__}: {failed})")
        elif found is None:
            what = f"A {kind[:-3]} of the {expected} records was shorter than indexed"
        shown = ", ".join(map(str, firsts[:8].tolist())) + (", ..." if len(firsts) > 8 else "")
        msg = (
            f"{what} of window {window} of epoch {epoch} (records [{shown}] "
            f"onwards, by range), which {self._source.description} reads whole. Read "
            "again, or take the read_batch path (e.g. `Workers(1)`) for this pipeline."
        )
        raise RuntimeError(msg) from failed

    def _read_by_batches(self, epoch: int, window: int, start: int) -> None:
        """Reads the batches of the positions window `window` of `epoch` of the global
        shuffle (or the natural order) gives the iteration from `start` (whole: a batch
        may straddle windows), as the ``read_batch`` path reads them
        (`TFRecordSource.read_packed`), so that a failing record raises that path's error.

        Raises:
            RecordError: a record failed its checks (the source's error as its cause).
        """
        plan = self.engine.plan
        size = plan.layout.batch_size
        low, high = self._bounds(start, epoch, window)
        phase, usable = self._cut(start, epoch)
        base = epoch * plan.layout.records_per_epoch
        for first in range(low - (low - phase) % size, high, size):
            indices = plan.indices(epoch, first, min(first + size, usable))
            try:
                self._source.read_packed(indices)
            except Exception as err:
                raise checks.batch_error("read_batch", err, indices, epoch,
                                         base + first) from err

    # -- the dataset ---------------------------------------------------------------------
    def dataset(
        self,
        start: Callable[[], int],
        *,
        rest_of_epoch: bool,
        watch: delivery.Watch | None = None,
    ) -> tf.data.Dataset:
        begin = graph_path.Begin(start, watch, self, rest_of_epoch=rest_of_epoch)
        # Without a watch (the eager loop's pipeline, which the ledger follows by the
        # batches' ends) no iteration is counted or checked: the loop supersedes the
        # dataset() iterations once it has started its own.
        checked = watch is not None
        count = self._count
        spooled = self._spool is not None
        metadata = self._metadata
        treespec = self.spec.treespec
        size = self.engine.plan.layout.batch_size
        drop = self.engine.plan.layout.drop_remainder
        exiting.install()
        place = columns_lib.weakly(self, _window_at)
        check = columns_lib.weakly(self, _check_window)

        @_no_autograph
        def run(name: tf.Tensor, offset: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
            variant = tf.raw_ops.TFRecordDatasetV2(
                filenames=tf.reshape(name, [1]), compression_type="",
                buffer_size=tf.constant(BUFFER_BYTES, tf.int64),
                byte_offsets=tf.reshape(offset, [1]))
            # A corrupt or missing record ends the run: the count finds it (`check_window`).
            return tf.data.experimental.from_variant(variant, _RECORD).take(count).ignore_errors()

        @_no_autograph
        def read(position: tf.Tensor, serial: tf.Tensor, number: tf.Tensor,
                 windows: tf.Tensor) -> dict[str, Any]:
            # (Spooling writes a slot: stateful, never folded or repeated by TensorFlow.)
            made = tf.numpy_function(place, [position, number, serial, windows],
                                     [tf.int64] * len(_FIELDS) + [tf.string],
                                     stateful=spooled)
            window = dict(zip((*_FIELDS, "names"), made, strict=True))
            for value in made:
                value.set_shape([None])
            where = window["where"]
            runs = tf.data.Dataset.from_tensor_slices(
                (window["names"], window["offsets"], window["counts"]))
            # One batch of all the records found, or an empty one if none was
            # (`get_single_element` needs exactly one).
            found = runs.flat_map(run).batch(tf.maximum(where[1], 1)).concatenate(
                tf.data.Dataset.from_tensors(tf.constant([], tf.string)))
            records = found.take(1).get_single_element()
            good = tf.numpy_function(
                check, [tf.size(records, out_type=tf.int64), window["files"], where[0],
                        where[7], where[8], where[9], where[10]], tf.bool, stateful=True)
            with tf.control_dependencies([good]):
                window["records"] = tf.identity(records)
            # Only what the batches need goes on (each value is one more op per call).
            for name in ("files", "offsets", "counts", "names"):
                del window[name]
            return window

        @_no_autograph
        def carry(kept: tf.Tensor, window: dict[str, Any]) -> tuple[tf.Tensor, Any]:
            where, records = window["where"], window["records"]
            counted = count.counted(where[2], where[6]) if checked else []
            head = tf.concat([kept, tf.gather(records, window["head"])], 0)
            # The rows carried in go on only when no batch ends in this window.
            kept_next = tf.concat(
                [kept[: where[5] * tf.size(kept, out_type=tf.int64)],
                 tf.gather(records, window["carry"])], 0)
            with tf.control_dependencies(counted):
                tail = tf.gather(records, window["tail"])
            del window["carry"]
            return kept_next, {**window, "head": head, "tail": tail}

        @_no_autograph
        def refs(window: dict[str, Any]) -> tf.data.Dataset:
            # Each batch as (its strings, (the rows of them it takes, [its record indices,
            # position and epoch])): a whole batch takes rows of the window's records, a
            # head or tail batch (made in `carry`) all of its own.
            where, positions = window["where"], window["positions"]
            full = tf.reshape(window["full"], [-1, size])
            count = tf.shape(full, out_type=tf.int64)[0]
            head, tail = window["head"], window["tail"]
            labels: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
            if metadata is not None:
                epoch = where[0]
                labels = (
                    [window["head_indices"], positions[0], epoch],
                    [tf.reshape(window["full_indices"], [-1, size]),
                     positions[where[3] : where[3] + count], tf.fill([count], epoch)],
                    [window["tail_indices"], positions[-1], epoch])
            whole = tf.data.Dataset.zip((
                tf.data.Dataset.from_tensors(window["records"]).repeat(),
                tf.data.Dataset.from_tensor_slices((full, *labels[1]))))
            heads = tf.data.Dataset.from_tensors(
                (head, (tf.range(tf.size(head, out_type=tf.int64)), *labels[0])))
            tails = tf.data.Dataset.from_tensors(
                (tail, (tf.range(tf.size(tail, out_type=tf.int64)), *labels[2])))
            return heads.take(where[3]).concatenate(whole).concatenate(tails.take(where[4]))

        @_no_autograph
        def gathered(strings: tf.Tensor, taken: tuple[tf.Tensor, ...]) -> Any:
            batch = tf.gather(strings, taken[0])
            if drop:
                batch = tf.ensure_shape(batch, [size])
            data = optree.tree_unflatten(treespec, [batch])
            if metadata is None:
                return data
            indices, position, epoch = taken[1:]
            if drop:
                indices = tf.ensure_shape(indices, [size])
            return data, metadata(graph_batches.BatchIndices(indices, epoch, position))

        @_no_autograph
        def iteration(_: tf.Tensor) -> tf.data.Dataset:
            position, serial, windows = (
                tf.reshape(value, ()) for value in tf.py_function(begin, [], [tf.int64] * 3))
            # One window at a time, the next read while this one's batches are made: the
            # first window (read before the first batch) has the machine to itself.
            return tf.data.Dataset.range(windows).map(
                lambda number: read(position, serial, number, windows)).prefetch(
                    READ_AHEAD - 1)

        ds = tf.data.Dataset.range(1).flat_map(iteration)
        ds = ds.scan(tf.constant([], tf.string), carry).flat_map(refs)
        ds = ds.map(gathered, **graph.parallel_map())  # sequential under op determinism
        return self.prefetched(self.finisher.map(ds, self.batch_dim)).with_options(
            graph_path.OPTIONS)

    # -- for batch in loader ------------------------------------------------------------
    def eager(self, position: int) -> Iterator[tuple[Any, int]]:
        """The batches of ``for batch in loader`` from `position`, each with the position
        after it: the produced batches (`DeliveryPath.eager`, a Python thread); with tensor
        stages the batches of this path's dataset, each batch's end from the layout."""
        if not self.finisher.stages:
            return super().eager(position)
        return self.eager_by_layout(position)

    # -- describe() ------------------------------------------------------------------
    def source_row(self) -> delivery.Row:
        pipeline = self.engine.plan.pipeline
        record = self.engine.producer.spec.describe()
        how = ("each window's chunks read by TensorFlow's TFRecord reader from their byte "
               "offsets (TFRecordDatasetV2, CRC32C checked)")
        if self._order is None:
            how = (f"each window of {self._window_records} positions: its records, sorted, "
                   "read by runs (one preadv each) into a memfd file, read by TensorFlow's "
                   "TFRecord reader (TFRecordDatasetV2, CRC32C checked)")
        elif self._spool is not None:
            how = ("each window's chunks spooled from the object store (their blocks' GETs "
                   "through the span cache, the next window's started ahead) into a memfd "
                   "file, read by TensorFlow's TFRecord reader (TFRecordDatasetV2, CRC32C "
                   "checked)")
        return ("source", f"{pipeline.source.description}: {how}", record, "re-read")

    def handover_rows(self) -> list[delivery.Row]:
        mapped = "map(AUTOTUNE, deterministic)"
        return [
            ("order", "tfrecord_graph path: each window's runs and the rows of its batches "
             "by NumPy (the plan's order, one numpy_function per window), the next window "
             "read ahead", "string[None]", "recomputed"),
            ("map", f"tf.gather(window records, rows), {mapped}", self.batch_text(),
             "recomputed"),
        ]


def _window_records(batch_size: int, mean_record_bytes: float, per_epoch: int) -> int:
    """The positions of a window of the global shuffle (or the natural order): whole
    batches of about `WINDOW_BYTES` of records and at most `WINDOW_RECORDS` records, at
    least one batch, at most the epoch."""
    records = min(WINDOW_BYTES / max(mean_record_bytes, 1.0), WINDOW_RECORDS)
    batches = int(records) // batch_size
    return max(1, min(batches, -(-per_epoch // batch_size))) * batch_size


def _runs(files: tfrecord.LocalFiles, firsts: np.ndarray, lasts: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of records ``[firsts[k], lasts[k])`` (sorted, disjoint): neighbours merged,
    cut at file ends, as (file, byte offset of the first record, records)."""
    joined = np.flatnonzero(firsts[1:] != lasts[:-1]) + 1
    lows = firsts[np.concatenate([[0], joined])]
    highs = lasts[np.concatenate([joined - 1, [len(lasts) - 1]])]
    out_files, out_offsets, out_counts = [], [], []
    for low, high in zip(lows.tolist(), highs.tolist(), strict=True):
        file = int(np.searchsorted(files.ends, low, side="right"))
        while low < high:
            stop = min(high, int(files.ends[file]))
            if stop > low:
                out_files.append(file)
                out_offsets.append(int(files.offsets[low]))
                out_counts.append(stop - low)
            low = stop
            file += 1
    return (np.array(out_files, np.int64), np.array(out_offsets, np.int64),
            np.array(out_counts, np.int64))


def _window_at(path: TFRecordGraphPath, position: Any, number: Any, serial: Any,
               windows: Any) -> list[np.ndarray]:
    return path.window_at(int(position), int(number), int(serial), int(windows))


def _check_window(path: TFRecordGraphPath, found: Any, files: Any, epoch: Any, window: Any,
                  slot: Any, token: Any, start: Any) -> np.ndarray:
    return np.array(path.check_window(int(found), files, int(epoch), int(window), int(slot),
                                      int(token), int(start)))

