"""`TFRecordSource`: random access to uncompressed TFRecord files, without TensorFlow.

TensorFlow reads TFRecord only sequentially. This source indexes every file once
(`resumeloader.sources.tfrecord_index`: record offsets, built from the 12-byte
headers, cached; an object's index is `resumeloader.sources.remote_index`) and reads
any batch of records as byte ranges (`resumeloader.sources.storage.ranges`: a local
file's neighbours coalesced into one ``pread`` through the bounded cache of open
files, an object's into ranged GETs), returned in the requested order, each checked
against its CRC32C checksums. Records are the serialized bytes (typically
``tf.train.Example``): parse and decode them in TensorFlow with `Pipeline.tf_map`.

A loader reads a batch with `read_packed` instead, without a Python read per record
for local files: each run of neighbouring records (in the file) is read by one ``preadv``
straight into one recycled buffer, the batch's column of strings in the packed wire
format (`resumeloader.core.wire.packed`: the runs as they lie in the files, and where
each record's data starts); an object's records come through the span cache as for
`read_batch` (the same GETs, received into recycled memory) and are copied into
place, a run at a time when the source reads by blocks (`blocked`: runs are cut at
block boundaries, so that each lies in its block's GET). Read by blocks, a local file's
block is read by one ``preadv`` and held (`_Held`: two windows' worth of bytes) for the
other records of its window, which are copied out of it (one ``pread`` per block and
window, not one per record). The framing is checked with
array operations, and each record's data by one CRC32C call (no library computes the
checksums of many ranges in one call, and google-crc32c takes only bytes): with
`verify_checksums` that call, on the record's data copied out as bytes, is the Python
left per record. Those bytes go along with the column (`wire.with_strings`): the hand-off
to TensorFlow takes them as they are, instead of copying each record out again. A batch
that fails a check is read again record by record, which names the record (file, number,
byte offset).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import os
import struct
import threading
from typing import Any

import google_crc32c
import numpy as np

from resumeloader.core import spec as spec_lib
from resumeloader.core import wire
from resumeloader.sources import base, file_records, remote_index
from resumeloader.sources import tfrecord_index as index_lib
from resumeloader.sources import tfrecord_objects as objects_lib
from resumeloader.sources.base import CorruptRecordError
from resumeloader.sources.storage import (
    answers,
    fetch,
    handles,
    locations,
    objects,
    options,
    ranges,
)

__all__ = ["CorruptRecordError", "LocalFiles", "TFRecordSource"]

_LEAF = spec_lib.RecordSpec.of(b"").leaves[0]

_LENGTH = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_HEAD, _TAIL = np.arange(12), np.arange(4)


def _crc_tables() -> np.ndarray:
    """The slicing-by-8 tables of CRC32C (Castagnoli, reflected): row 0 is the byte
    table; row ``k`` advances a byte's CRC through ``k`` more zero bytes."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    tables = np.empty((8, 256), dtype=np.uint32)
    tables[0] = table
    for k in range(1, 8):
        tables[k] = (tables[k - 1] >> 8) ^ table[tables[k - 1] & 0xFF]
    return tables


_TABLES = _crc_tables()
_ROWS = np.arange(7, -1, -1)  # byte j of 8 goes through 7 - j more bytes
_START = np.array([0xFF] * 4 + [0] * 4, dtype=np.uint8)  # the initial CRC, 0xFFFFFFFF


def _masked_crcs(rows: np.ndarray) -> np.ndarray:
    """`tfrecord_index.masked_crc` of each row of `rows` (uint8 ``[n, 8]``: the length
    fields), with array operations (slicing by 8)."""
    found = np.bitwise_xor.reduce(_TABLES[_ROWS, rows ^ _START], axis=1)
    return _masked(found ^ np.uint32(0xFFFFFFFF))


def _masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's mask of CRC32C values (uint32), as `tfrecord_index.masked_crc`."""
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)


class _Corrupt(Exception):
    pass


#: At most this many bytes of local blocks held per source read by blocks (`_Held`):
#: past it (huge windows) local records are read by runs, as in the global shuffle.
HELD_BYTES = 256 << 20


class _Held:
    """The blocks of local files that a source read by blocks holds: (file, block) ->
    (the block's first byte in its file, its bytes), the least recently used dropped
    past `budget` bytes (the blocks of a window and the next, each read once; a block
    over many small files is a piece per file)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._bytes = 0
        self._sizes: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._blocks: collections.OrderedDict[tuple[int, int], tuple[int, memoryview]] = (
            collections.OrderedDict()
        )

    def get(self, key: tuple[int, int]) -> tuple[int, memoryview] | None:
        with self._lock:
            found = self._blocks.get(key)
            if found is not None:
                self._blocks.move_to_end(key)
            return found

    def put(self, key: tuple[int, int], block: tuple[int, memoryview], size: int) -> None:
        """Holds `block`, of `size` bytes (a dry run holds the sizes, not the bytes)."""
        with self._lock:
            self._bytes += size - self._sizes.pop(key, 0)
            self._sizes[key] = size
            self._blocks[key] = block
            self._blocks.move_to_end(key)
            while self._bytes > self.budget and len(self._blocks) > 1:
                dropped, _ = self._blocks.popitem(last=False)
                self._bytes -= self._sizes.pop(dropped)

    def __contains__(self, key: object) -> bool:
        return key in self._blocks

    def __reduce__(self) -> tuple[Any, ...]:
        return _Held, (self.budget,)  # a copy in another process holds nothing yet


@dataclasses.dataclass(frozen=True)
class LocalFiles:
    """Where the records of a source of local TFRecord files lie, for a reader of whole
    runs of records (TensorFlow's TFRecord reader: `resumeloader.tfdata.tfrecord_graph`).

    Attributes:
        paths: each file's path, as bytes (``os.fsencode``: any file name).
        stamps: each file's (size, modification time in ns) when it was indexed.
        starts: the index of each file's first record (int64).
        ends: the index after each file's last record (int64).
        offsets: every record's byte offset in its file, framing included (int64).
    """

    paths: tuple[bytes, ...]
    stamps: tuple[tuple[int, int], ...]
    starts: np.ndarray
    ends: np.ndarray
    offsets: np.ndarray

    def changed(self, files: Any) -> bool:
        """Whether any of `files` (numbers) is no longer the file that was indexed (its
        size or modification time differs, or it is gone): one ``stat`` each."""
        for file in set(np.asarray(files).tolist()):
            try:
                stat = os.stat(self.paths[file])
            except OSError:
                return True
            if (stat.st_size, stat.st_mtime_ns) != self.stamps[file]:
                return True
        return False


class TFRecordSource(file_records.FileRecordSource):
    """Uncompressed TFRecord files as a random-access source of serialized records (bytes).

    Guarantees: record ``i`` is the ``i``-th record of the files in the order given
    (a glob is sorted), every time, in every process. The files' names, sizes,
    record layouts and a hash of each file's first 64 KiB are order fields: a
    checkpoint of other files is refused, naming what differs (regenerated files
    with the same names and record sizes included, unless they differ only past
    their first 64 KiB). A file that changes after it was indexed is refused when
    it is opened again (`CorruptRecordError`), never read as other bytes. Every read
    checks the record's CRC32C checksums (length and data; about 1 µs per 3 KB
    record) unless `verify_checksums` is False; a corrupt record raises
    `CorruptRecordError` (a `RecordError` by the time it reaches you) naming the
    file, the record's number in it and its byte offset.

    Args:
        paths: a file, a glob pattern, or a list of files and patterns (a path
            naming an existing file is that file, glob characters and all); or URLs
            of objects (``s3://``, ``gs://``, ``http(s)://``, ``memory://``) and their
            patterns.
        index_dir: where the offset indexes are kept (default: the
            ``tfrecord-index`` folder of `Storage.cache_dir`: of
            ``$RESUMELOADER_CACHE_DIR``, else of ``~/.cache/resumeloader``). An index
            is rebuilt when its file's size, modification time or first 64 KiB
            change, or when it fails its checks.
        verify_checksums: check each record's CRC32C when it is read.
        storage: where objects are and how they are read (`Storage`: filesystem
            options, retries, concurrency, read-ahead, the cache folder).
        storage_options: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(options=...)``.
        object_reads: the spelling of 0.3 (deprecated): pass
            ``storage=Storage(reads=...)``.

    Raises:
        FileNotFoundError: a file or pattern names nothing.
        ValueError: a file is GZIP or ZLIB compressed (no random access: decompress
            it once), is not a valid TFRecord file, or every file is empty.

    Examples:
        >>> import os, tempfile, tensorflow as tf
        >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
        >>> with tf.io.TFRecordWriter(path) as writer:
        ...     for word in (b"a", b"bb", b"ccc"):
        ...         writer.write(word)
        >>> source = TFRecordSource(path, index_dir=tempfile.mkdtemp())
        >>> len(source), source.read(2), source.read_batch(np.array([1, 0]))
        (3, b'ccc', [b'bb', b'a'])
    """

    kind = "TFRecord"
    companion = remote_index.SIDECAR_SUFFIX

    def __init__(
        self,
        paths: locations.Paths,
        *,
        index_dir: str | os.PathLike[str] | None = None,
        verify_checksums: bool = True,
        storage: options.Storage | None = None,
        storage_options: Any = None,
        object_reads: Any = None,
    ) -> None:
        storage = options.given(
            storage, "TFRecordSource", storage_options=storage_options,
            object_reads=object_reads,
        )
        self._index_dir = (
            os.fspath(index_dir) if index_dir is not None
            else storage.under(index_lib.FOLDER)
        )
        self._verify = bool(verify_checksums)
        #: Records per block of aligned reads (`blocked`), or None.
        self.block_records: int | None = None
        self._blocks: objects_lib.Blocks | None = None
        # The local blocks held when read by blocks (`blocked`), else None.
        self._held: _Held | None = None
        # The blocks the last `prefetch` announced: (process id, their keys), or None.
        self._announced: tuple[int, bytes] | None = None
        super().__init__(paths, storage=storage)
        # Every record's offset (in its file), the files' in order, in one array that the
        # indexes then view (no second copy): `_spans` finds a batch's byte ranges with a
        # few array operations, whatever the number of files.
        self._offsets = np.concatenate([layout.data.offsets for layout in self._layouts])
        self._layouts = [
            dataclasses.replace(layout, data=dataclasses.replace(
                layout.data, offsets=self._offsets[begin:end]))
            for layout, begin, end in zip(self._layouts, self._starts.tolist(),
                                          self._ends.tolist(), strict=True)
        ]
        self._indexes: list[index_lib.FileIndex] = [layout.data for layout in self._layouts]
        self._sizes = np.array([ix.size for ix in self._indexes], dtype=np.int64)
        # Where each file starts when the files are laid end to end, `ranges.GAP` apart
        # (`read_packed` cuts the runs of all files at once).
        sizes = self._sizes + ranges.GAP + 1
        self._bases = np.cumsum(sizes) - sizes
        if not self._remote.any():
            base.without(self, "prefetch", "readahead")  # nothing to read ahead

    def _prepare(self) -> None:
        # Sidecars: those the globs' listings found, else one listing per folder of the
        # objects named one by one (only for objects with no index kept here).
        unlisted = [
            location for location in self._locations
            if isinstance(location, objects.Object) and location.url not in self._beside
            and not remote_index.kept(location, self._index_dir)
        ]
        self._sidecars = {url: car for url, car in self._beside.items() if car is not None}
        if unlisted:
            self._sidecars.update(remote_index.sidecars(unlisted))

    def _layout(self, file: int) -> file_records.Layout:
        location = self._locations[file]
        if isinstance(location, objects.Object):
            ix = remote_index.load_or_build(
                location, self._index_dir, self._storage.reads,
                sidecar=self._sidecars.get(location.url),
            )
        else:
            ix = index_lib.load_or_build(location.path, self._index_dir)
        return file_records.Layout(len(ix.offsets), f"{ix.size}:{ix.digest}", ix.head, ix)

    @property
    def _keep_dir(self) -> str:
        return self._index_dir

    def _spans(self, files: np.ndarray, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The byte range [start, stop) of each record, its framing included."""
        records = self._starts[files] + numbers
        starts = self._offsets[records]
        # A record ends where the next one starts, the last one at the end of the file.
        following = self._offsets[np.minimum(records + 1, len(self._offsets) - 1)]
        stops = np.where(records + 1 == self._ends[files], self._sizes[files], following)
        return starts, stops

    def local_files(self) -> LocalFiles | None:
        """Where the records lie (`LocalFiles`) when every file is local and every read
        checks the checksums (TensorFlow's reader always does); else None."""
        if self._remote.any() or not self._verify:
            return None
        wheres = [where for where in self._locations if isinstance(where, locations.LocalFile)]
        return LocalFiles(
            tuple(os.fsencode(where.path) for where in wheres),
            tuple(where.stamp for where in wheres),
            self._starts, self._ends, self._offsets,
        )

    def spoolable(self) -> bool:
        """Whether every file is an object, read by blocks (`blocked`), with checksums
        checked: a window's records can then be written out whole (`spool`) for a reader
        of TFRecord files (TensorFlow's: `resumeloader.tfdata.tfrecord_graph`)."""
        return (bool(self._remote.all()) and self._verify and self._blocks is not None
                and bool(self.block_records))

    def pieces(self, firsts: np.ndarray, lasts: np.ndarray) -> np.ndarray:
        """The records ``[firsts[k], lasts[k])`` (sorted, disjoint) cut at file ends and
        block boundaries: the first and the record after the last of each piece (int64
        ``[n, 2]``), in record order; each piece lies in one block of one file."""
        size = self.block_records
        assert size
        ends = self._ends
        out: list[tuple[int, int]] = []
        for low, high in zip(firsts.tolist(), lasts.tolist(), strict=True):
            file = int(np.searchsorted(ends, low, side="right"))
            while low < high:
                while int(ends[file]) <= low:  # empty files
                    file += 1
                stop = min(high, int(ends[file]), (low // size + 1) * size)
                out.append((low, stop))
                low = stop
        return np.array(out, dtype=np.int64).reshape(-1, 2)

    def spool(self, pieces: np.ndarray, fd: int) -> int | None:
        """Writes the records of `pieces` (`pieces`), framing included, one after the
        other from byte 0 of the file `fd` (``os.pwrite``): a TFRecord file of those
        records, in order. Each object's block is asked of the span cache once, as
        `read_packed` asks it (the same GETs, merged, retried, pinned to the object's
        version). Returns the bytes written, or None when a block is shorter than
        indexed. Only for a source that is `spoolable`.

        Raises:
            ObjectChangedError, ObjectReadError, Refusal: as `ranges.read`.
        """
        assert self._blocks is not None and self.block_records
        lows, highs = pieces[:, 0], pieces[:, 1]
        files = np.searchsorted(self._ends, lows, side="right")
        starts = self._spans(files, lows - self._starts[files])[0]
        stops = self._spans(files, highs - 1 - self._starts[files])[1]
        wanted, which = self._block_ranges(files, lows // self.block_records, starts, stops)
        views = ranges.read(wanted, self._storage.reads, blocks=self._blocks)
        for (_, low, high), view in zip(wanted, views, strict=True):
            if len(view) != high - low:
                return None
        at = 0
        for w, start, stop in zip(which.tolist(), starts.tolist(), stops.tolist(), strict=True):
            low = wanted[w][1]
            view = views[w][start - low : stop - low]
            while view:  # (a regular file's pwrite writes all; a short one goes on)
                done = os.pwrite(fd, view, at)
                view, at = view[done:], at + done
        return at

    def spool_local(self, firsts: np.ndarray, lasts: np.ndarray, fd: int,
                    buffer: np.ndarray | None = None) -> tuple[int | None, np.ndarray]:
        """`spool` of local files: writes the records ``[firsts[k], lasts[k])`` (sorted,
        disjoint, each range inside one file), framing included, one after the other
        from byte 0 of the file `fd`: each range read by one ``preadv`` (through the
        bounded cache of open files, each file's stamp checked after its reads) into
        `buffer` (grown when too small), then written by one ``pwrite``. Returns the
        bytes written (None when a file is shorter than indexed) and the buffer, to be
        passed again. Only for a source whose files are all local.

        Raises:
            StaleFileError: a file changed since it was indexed.
        """
        if not len(firsts):
            return 0, buffer if buffer is not None else np.empty(0, dtype=np.uint8)
        files = np.searchsorted(self._ends, firsts, side="right")
        begins = self._offsets[firsts]
        ends = self._spans(files, lasts - 1 - self._starts[files])[1]
        sizes = ends - begins
        stops = np.cumsum(sizes)
        total = int(stops[-1]) if len(stops) else 0
        if buffer is None or len(buffer) < total:
            buffer = np.empty(max(total, 1 << 20), dtype=np.uint8)
        memory = buffer.data
        targets = list(map(memory.__getitem__, map(slice, (stops - sizes).tolist(),
                                                   stops.tolist())))
        offsets = begins.tolist()
        bounds = [0, *(np.flatnonzero(files[1:] != files[:-1]) + 1).tolist(), len(files)]
        wheres: list[tuple[str, handles.Stamp | None]] = []
        for file in files[bounds[:-1]].tolist():
            where = self._locations[file]
            assert isinstance(where, locations.LocalFile)
            wheres.append((where.path, where.stamp))
        done = handles.pread_into_files(
            wheres, [list(zip(targets[lo:hi], offsets[lo:hi], strict=True))
                     for lo, hi in itertools.pairwise(bounds)])
        if list(itertools.chain.from_iterable(done)) != sizes.tolist():
            return None, buffer
        view, at = memory[:total], 0
        while view:  # (a regular file's pwrite writes all; a short one goes on)
            written = os.pwrite(fd, view, at)
            view, at = view[written:], at + written
        return total, buffer

    def read_packed(self, indices: np.ndarray) -> np.ndarray:
        """`read_batch(indices)` as a column of strings in the packed wire format
        (`resumeloader.core.wire.packed`), read by runs without Python per record (see
        the module docstring); the same records, the same errors."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            return wire.encode(self.read_batch(indices), _LEAF)  # read_batch's IndexError
        files = np.searchsorted(self._ends, indices, side="right")
        numbers = indices - self._starts[files]
        try:
            packed = self._packed(files, numbers)
        except (handles.StaleFileError, fetch.ObjectReadError, answers.Refusal) as err:
            at = self._failing(err, files)
            raise self._failed(files[at], numbers[at], err) from err
        if packed is None:  # a check failed: read record by record, which names it
            return wire.encode(self._records(indices), _LEAF)
        return packed

    def _packed(self, files: np.ndarray, numbers: np.ndarray) -> np.ndarray | None:
        """The packed column of the records (see `read_packed`), or None when a record
        fails a check."""
        if not len(files):
            return wire.packed(files, files, 0)[0]
        starts, stops = self._spans(files, numbers)
        # Runs: the records sorted by (file, start), the files laid end to end apart.
        bases = self._bases
        order = np.lexsort((starts, files))
        run_starts = ranges.cut(bases[files[order]] + starts[order],
                                bases[files[order]] + stops[order])
        block = None
        if self._blocks is not None and self.block_records:
            # Read by blocks: a run stays inside one block, whose GET (an object's) or
            # pread (a local file's, when blocks are held) holds it.
            block = (self._starts[files] + numbers)[order] // self.block_records
            cuts = np.flatnonzero(block[1:] != block[:-1]) + 1
            if self._held is None:
                cuts = cuts[self._remote[files[order[cuts]]]]
            starting = np.zeros(len(order), dtype=bool)
            starting[run_starts] = True
            starting[cuts] = True
            run_starts = np.flatnonzero(starting)
            block = block[run_starts]
        run_ends = np.append(run_starts[1:], len(order))
        first, last = order[run_starts], order[run_ends - 1]
        # sorted by start, a run's last record ends it (records never overlap)
        begin, end = starts[first], stops[last]
        sizes = end - begin
        at = np.cumsum(sizes) - sizes  # where each run lands in the values
        run_of = np.repeat(np.arange(len(run_starts)), run_ends - run_starts)
        where = np.empty(len(order), dtype=np.int64)
        where[order] = at[run_of] + starts[order] - begin[run_of]
        lengths = stops - starts - 16
        out, values = wire.packed(lengths, where + 12, int(sizes.sum()))
        runs = (files[first], begin, end, at)
        if not self._fill(values, runs, (files, starts, stops, where), block):
            return None
        strings = self._checked(values, where, lengths)
        # The strings made to check them go along (`wire.with_strings`): the hand-off to
        # TensorFlow takes them instead of copying each out of the column again.
        return None if strings is None else wire.with_strings(out, strings)

    def _fill(self, values: np.ndarray, runs: tuple[np.ndarray, ...],
              records: tuple[np.ndarray, ...], block: np.ndarray | None) -> bool:
        """Reads the local files' runs (file, [begin, end), at: where in `values`) by one
        ``preadv`` each, and the objects' records (file, [start, stop), at) through the
        span cache (its GETs merged and read ahead as for `read_batch`: a run of
        objects' records could straddle two spans, and cost a GET of its own), each
        copied into place; read by blocks (`block`: each run's block), an object's runs
        are cut out of their blocks, the cache asked once per block; False when a file
        is shorter than indexed."""
        memory = values.data
        files, begins, ends, puts = runs
        mine = np.flatnonzero(~self._remote[files])
        if len(mine) and self._held is not None and block is not None:
            # Read by blocks: each run cut out of its block, each block read once.
            views = self._held_views(files[mine], block[mine], begins[mine], ends[mine])
            if views is None:
                return False
            for put, view in zip(puts[mine].tolist(), views, strict=True):
                memory[put : put + len(view)] = view
        elif len(mine):
            # The runs are sorted by file: each local file's runs lie together.
            here, size = files[mine], ends[mine] - begins[mine]
            bounds = [0, *(np.flatnonzero(here[1:] != here[:-1]) + 1).tolist(), len(mine)]
            targets = list(map(memory.__getitem__, map(
                slice, puts[mine].tolist(), (puts[mine] + size).tolist())))
            offsets = begins[mine].tolist()
            wheres = [self._locations[file] for file in here[bounds[:-1]].tolist()]
            done = handles.pread_into_files(
                [(where.path, where.stamp) for where in wheres],
                [list(zip(targets[lo:hi], offsets[lo:hi], strict=True))
                 for lo, hi in itertools.pairwise(bounds)],
            )
            if list(itertools.chain.from_iterable(done)) != size.tolist():
                return False
        if block is not None:
            return self._fill_blocks(memory, runs, block)
        files = records[0]
        remote = np.flatnonzero(self._remote[files])
        if len(remote):
            starts, stops, at = (a[remote].tolist() for a in records[1:])
            wanted = [(self._locations[file], start, stop) for file, start, stop in zip(
                files[remote].tolist(), starts, stops, strict=True)]
            views = ranges.read(wanted, self._storage.reads, blocks=self._blocks)
            for put, start, stop, view in zip(at, starts, stops, views, strict=True):
                if len(view) != stop - start:
                    return False
                memory[put : put + stop - start] = view
        return True

    def _fill_blocks(self, memory: memoryview, runs: tuple[np.ndarray, ...],
                     block: np.ndarray) -> bool:
        """`_fill` of the objects' runs of a source read by blocks: each block's range
        asked of the span cache once (`_block_ranges`), its runs cut out of it."""
        files = runs[0]
        remote = np.flatnonzero(self._remote[files])
        if not len(remote):
            return True
        wanted, which = self._block_ranges(
            files[remote], block[remote], runs[1][remote], runs[2][remote]
        )
        views = ranges.read(wanted, self._storage.reads, blocks=self._blocks)
        for (_, low, high), view in zip(wanted, views, strict=True):
            if len(view) != high - low:
                return False
        lows = [low for _, low, _ in wanted]
        for k, w in zip(remote.tolist(), which.tolist(), strict=True):
            start, stop, put = int(runs[1][k]), int(runs[2][k]), int(runs[3][k])
            low = lows[w]
            memory[put : put + stop - start] = views[w][start - low : stop - low]
        return True

    def _block_ranges(self, files: np.ndarray, block: np.ndarray, starts: np.ndarray,
                      stops: np.ndarray) -> tuple[list[fetch.Range], np.ndarray]:
        """The reads of objects' ranges (file `files[k]`, bytes ``[starts[k], stops[k])``,
        inside block `block[k]`) of a source read by blocks: the range of each
        (object, block), once, by object and block (what `read_packed` asks of the span
        cache, and `dry_read` records); and which of them holds each range."""
        assert self._blocks is not None
        _, first, which = np.unique(
            files * (len(self) + 1) + block, return_index=True, return_inverse=True
        )
        wanted: list[fetch.Range] = []
        for k in first.tolist():
            location = self._locations[int(files[k])]
            assert isinstance(location, objects.Object)
            wanted.append((location, *self._blocks(location, int(starts[k]), int(stops[k]))))
        return wanted, which.reshape(-1)

    def _held_views(self, files: np.ndarray, block: np.ndarray, begins: np.ndarray,
                    ends: np.ndarray) -> list[memoryview] | None:
        """Bytes ``[begins[k], ends[k])`` of local file ``files[k]``, inside block
        ``block[k]``, cut out of the blocks held (`_held_blocks`); None when a file is
        shorter than indexed."""
        held = self._held_blocks(files, block)
        if held is None:
            return None
        datas, lows, which = held
        return [datas[w][low:high] for w, low, high in zip(
            which.tolist(), (begins - lows[which]).tolist(), (ends - lows[which]).tolist(),
            strict=True)]

    def _held_blocks(self, files: np.ndarray, block: np.ndarray
                     ) -> tuple[list[memoryview], np.ndarray, np.ndarray] | None:
        """The blocks (local file ``files[k]``, block ``block[k]``) from those held
        (`_Held`): the blocks not held read first, one ``preadv`` each (all of a call's
        in one `handles.pread_into_files` call). Returns each distinct block's bytes and
        first byte in its file (by file and block) and which of them holds item ``k``;
        None when a file is shorter than indexed (nothing is then held)."""
        held = self._held
        assert held is not None and self.block_records
        codes, which = np.unique(files * (len(self) + 1) + block, return_inverse=True)
        keys = list(zip((codes // (len(self) + 1)).tolist(), (codes % (len(self) + 1)).tolist(),
                        strict=True))
        found = [held.get(key) for key in keys]
        missing = [k for k, got in enumerate(found) if got is None]
        if missing:
            for k, got in zip(missing, self._read_blocks([keys[k] for k in missing]),
                              strict=True):
                if got is None:
                    return None
                found[k] = got
                held.put(keys[k], got, len(got[1]))
        lows = np.array([got[0] for got in found], dtype=np.int64)  # type: ignore[index]
        return [got[1] for got in found], lows, which.reshape(-1)  # type: ignore[index]

    def _block_spans(self, keys: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """The byte range [low, high) of each (file, block) of `keys` in its file: the
        block's records that lie in that file, framing included."""
        size = self.block_records
        assert size
        files = np.array([file for file, _ in keys], dtype=np.int64)
        blocks = np.array([b for _, b in keys], dtype=np.int64)
        first = np.maximum(blocks * size, self._starts[files]) - self._starts[files]
        last = np.minimum((blocks + 1) * size, self._ends[files]) - 1 - self._starts[files]
        return self._spans(files, first)[0], self._spans(files, last)[1]

    def _read_blocks(self, keys: list[tuple[int, int]]) -> list[tuple[int, memoryview] | None]:
        """The (low, bytes) of each local (file, block) of `keys`, read one ``preadv``
        each (None for a block its file no longer holds)."""
        lows, highs = self._block_spans(keys)
        datas = [np.empty(int(n), dtype=np.uint8).data for n in (highs - lows).tolist()]
        by_file: dict[int, list[int]] = {}
        for k, (file, _) in enumerate(keys):
            by_file.setdefault(file, []).append(k)
        wheres = [self._locations[file] for file in by_file]
        done = handles.pread_into_files(
            [(where.path, where.stamp) for where in wheres
             if isinstance(where, locations.LocalFile)],
            [[(datas[k], int(lows[k])) for k in ks] for ks in by_file.values()],
        )
        out: list[tuple[int, memoryview] | None] = [None] * len(keys)
        for ks, counts in zip(by_file.values(), done, strict=True):
            for k, count in zip(ks, counts, strict=True):
                if count == len(datas[k]):
                    out[k] = (int(lows[k]), datas[k])
        return out

    def _checked(self, values: np.ndarray, where: np.ndarray, lengths: np.ndarray
                 ) -> list[bytes] | None:
        """The data of every record framed in `values` at `where` (as bytes, in order)
        when each passes its checks, else None."""
        heads = values[where[:, None] + _HEAD]
        if not (heads[:, :8].copy().view("<u8")[:, 0] == lengths).all():
            return None
        first = where + 12
        ends = (first + lengths).tolist()
        # Each record's data as bytes: checked by one CRC32C call each (the library takes
        # only bytes), with no Python frame of ours per record, then handed over as is.
        strings = list(map(bytes, map(values.data.__getitem__, map(slice, first.tolist(), ends))))
        if not self._verify:
            return strings
        if not (_masked_crcs(heads[:, :8]) == heads[:, 8:].copy().view("<u4")[:, 0]).all():
            return None
        tails = values[(first + lengths)[:, None] + _TAIL].copy().view("<u4")[:, 0]
        found = np.fromiter(map(google_crc32c.value, strings), dtype=np.uint32,
                            count=len(where))
        return strings if bool((_masked(found) == tails).all()) else None

    def _read(self, files: np.ndarray, numbers: np.ndarray) -> list[bytes]:
        starts, stops = self._spans(files, numbers)
        wanted = [
            (self._locations[file], start, stop)
            for file, start, stop in zip(files.tolist(), starts.tolist(), stops.tolist(),
                                         strict=True)
        ]
        try:
            views = self._views(wanted, files, numbers, starts, stops)
        except (handles.StaleFileError, fetch.ObjectReadError, answers.Refusal) as err:
            names = [self._names[file] for file in files.tolist()]
            at = objects_lib.failing(err, list(range(len(files))), names, starts, stops)
            raise self._failed(files[at], numbers[at], err) from err
        out: list[bytes] = []
        for file, number, begin, stop, view in zip(
            files.tolist(), numbers.tolist(), starts.tolist(), stops.tolist(), views, strict=True
        ):
            try:
                out.append(self._record(view, stop - begin, file, number, begin))
            except _Corrupt as err:
                index = int(self._starts[file] + number)
                msg = f"Record index {index}: {err}"
                raise CorruptRecordError(msg, record_index=index) from None
        return out

    def _views(self, wanted: list[ranges.Range], files: np.ndarray, numbers: np.ndarray,
               starts: np.ndarray, stops: np.ndarray) -> list[memoryview]:
        """The bytes of the records' ranges `wanted`; read by blocks, the objects' records
        are cut out of their blocks, the cache asked once per block, as `read_packed` does
        (`_block_ranges`), and the local files' out of the blocks held (`_held_views`)."""
        remote = self._remote[files]
        held = self._held is not None and bool(self.block_records)
        if not held and (self._blocks is None or not self.block_records or not remote.any()):
            return ranges.read(wanted, self._storage.reads, blocks=self._blocks)
        out: list[memoryview] = [memoryview(b"")] * len(wanted)
        local = np.flatnonzero(~remote)
        if len(local):
            views = None
            if held:
                assert self.block_records
                views = self._held_views(
                    files[local], (self._starts[files] + numbers)[local] // self.block_records,
                    starts[local], stops[local],
                )
            if views is None:  # the local files' ranges, read as `ranges.read` reads them
                views = ranges.read([wanted[k] for k in local.tolist()], self._storage.reads)
            for k, view in zip(local.tolist(), views, strict=True):
                out[k] = view
        at = np.flatnonzero(remote)
        if not len(at):
            return out
        assert self.block_records
        blocks, which = self._block_ranges(
            files[at], (self._starts[files] + numbers)[at] // self.block_records,
            starts[at], stops[at],
        )
        views = ranges.read(blocks, self._storage.reads, blocks=self._blocks)
        for k, w in zip(at.tolist(), which.tolist(), strict=True):
            low, view = blocks[w][1], views[w]
            out[k] = view[int(starts[k]) - low : int(stops[k]) - low]
        return out

    def _record(self, view: memoryview, size: int, file: int, number: int, begin: int) -> bytes:
        """The data of the record framed in `view` (`size` bytes expected), checked."""
        problem = None
        if len(view) < size:
            problem = "the file is shorter than when it was indexed (it changed)."
        else:
            length, length_crc = _LENGTH.unpack_from(view, 0)
            data = bytes(view[12 : size - 4])
            if length != size - 16:
                problem = (
                    f"its length field says {length} bytes, the index {size - 16}: "
                    "the file changed since it was indexed, or the byte is corrupt."
                )
            elif self._verify and index_lib.masked_crc(bytes(view[:8])) != length_crc:
                problem = "the length field fails its CRC32C checksum (corrupt data)."
            elif self._verify and index_lib.masked_crc(data) != _CRC.unpack_from(
                view, size - 4
            )[0]:
                problem = "the record's data fails its CRC32C checksum (corrupt data)."
        if problem is not None:  # the message is built only for a bad record
            path = locations.display(self._names[file])
            raise _Corrupt(f"{path}, record {number} (byte offset {begin}): {problem}")
        return data

    # -- object storage: the block order, read-ahead --------------------------------------
    def blocked(self, block_records: int | None, *, window_chunks: int = 1) -> TFRecordSource:
        """This source reading a block at a time: a record's GET reads its whole block
        of `block_records` consecutive records (the block order's chunk), kept in the
        process's cache for the other records of the block; a local file's block is
        read by one ``pread`` and held by the source for its other records (the blocks
        of two windows of `window_chunks` chunks, unless they exceed `HELD_BYTES`). The
        records are the same (each checked as it is read); only how they are read
        changes."""
        view = copy.copy(self)
        view.block_records = None if block_records is None else int(block_records)
        view._blocks = None
        view._held = None
        view._announced = None
        if block_records is not None:
            view._blocks = objects_lib.Blocks(self._indexes, self._starts, int(block_records))
            # A local file's block is read by one pread and held for the window's other
            # records: the blocks of the window and the next (and one more).
            mean = float(self._sizes.sum()) / max(1, len(self))
            budget = int((2 * int(window_chunks) + 1) * int(block_records) * mean)
            if not self._remote.all() and budget <= HELD_BYTES:
                view._held = _Held(budget)
        return view

    def prefetch(self, indices: np.ndarray, *, budget: int | None = None) -> bool:
        """Starts reading the objects' bytes of `indices` (see `fetch.prefetch`); False
        when the read-ahead budget is full: ``ObjectReads.readahead_bytes``, or for
        ``"auto"`` `budget` (the loader's choice). (Only a source with objects has it.)"""
        reads = self._storage.reads
        if fetch.ahead_bytes() >= fetch.budget_of(reads, budget):
            return False  # full: asked again after each batch, so nothing is computed
        indices = np.asarray(indices, dtype=np.int64)
        files = np.searchsorted(self._ends, indices, side="right")
        keys = None
        if self._blocks is not None and self.block_records:
            # Read by blocks, the tasks of a window need the same few blocks: a task
            # whose blocks are those last announced (in this process) needs nothing more.
            keys = (os.getpid(), np.unique(files * (len(self) + 1) + indices
                                           // self.block_records).tobytes())
            if keys == self._announced:
                return True
        wanted = self._object_ranges(indices, files)
        done = not wanted or fetch.prefetch(wanted, reads, blocks=self._blocks, budget=budget)
        if done and keys is not None:
            self._announced = keys
        return done

    def readahead(self) -> tuple[int | str, int]:
        """``(readahead_bytes, cache_bytes)`` of the objects' `ObjectReads`: a loader
        chooses the budget of ``"auto"`` and passes it to `prefetch`. (Only a source
        with objects has it.)"""
        reads = self._storage.reads
        return reads.readahead_bytes, reads.cache_bytes

    def dry_prefetch(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the GETs that ``prefetch(indices)`` starts."""
        wanted = self._object_ranges(indices)
        return not wanted or dry.prefetch(wanted, self._storage.reads, blocks=self._blocks)

    def dry_read(self, indices: np.ndarray, dry: fetch.DryRun) -> bool:
        """Records in `dry` the preads and GETs that ``read_batch(indices)`` and
        ``read_packed(indices)`` make."""
        indices = np.asarray(indices, dtype=np.int64)
        files = np.searchsorted(self._ends, indices, side="right")
        numbers = indices - self._starts[files]
        if self._blocks is not None and self.block_records:
            # as `read_packed` reads them: the objects' records by block, once each
            remote = self._remote[files]
            if remote.any():
                starts, stops = self._spans(files[remote], numbers[remote])
                wanted, _ = self._block_ranges(
                    files[remote], indices[remote] // self.block_records, starts, stops
                )
                dry.read(wanted, self._storage.reads, blocks=self._blocks,
                         wanted=int((stops - starts).sum()))
            files, numbers = files[~remote], numbers[~remote]
        if self._held is not None and len(files):
            self._dry_held(files, numbers, dry)
            return True
        ranges.dry_read(
            self._ranges(files, numbers), self._storage.reads, dry, blocks=self._blocks,
        )
        return True

    def _dry_held(self, files: np.ndarray, numbers: np.ndarray, dry: fetch.DryRun) -> None:
        """Records in `dry` the preads of the local records' blocks (`_held_blocks`): each
        block not held (in `dry`'s copy of what this source holds) read once; the records'
        bytes as wanted, whether their block was held or read."""
        assert self._held is not None and self.block_records
        held = dry.holdings.setdefault(id(self._held), _Held(self._held.budget))
        blocks = ((self._starts[files] + numbers) // self.block_records).tolist()
        keys = list(zip(files.tolist(), blocks, strict=True))
        missing = [key for key in sorted(set(keys)) if held.get(key) is None]
        starts, stops = self._spans(files, numbers)
        dry.held(int((stops - starts).sum()))
        if not missing:
            return
        lows, highs = self._block_spans(missing)
        for key, low, high in zip(missing, lows.tolist(), highs.tolist(), strict=True):
            held.put(key, (low, memoryview(b"")), high - low)
            where = self._locations[key[0]]
            assert isinstance(where, locations.LocalFile)
            dry.pread(where.path, low, high, wanted=0)

    def _object_ranges(self, indices: np.ndarray,
                       files: np.ndarray | None = None) -> list[fetch.Range]:
        """The byte ranges of the records of `indices` that lie in object storage
        (`files`: the file of each, when known)."""
        indices = np.asarray(indices, dtype=np.int64)
        if files is None:
            files = np.searchsorted(self._ends, indices, side="right")
        mine = self._remote[files]
        if not mine.any():
            return []
        indices, files = indices[mine], files[mine]
        if self._blocks is not None and self.block_records:
            # Read by blocks: one record of each (object, block) names its block's GET.
            _, first = np.unique(
                files * (len(self) + 1) + indices // self.block_records, return_index=True
            )
            indices, files = indices[first], files[first]
        return self._ranges(files, indices - self._starts[files])  # type: ignore[return-value]

    def _ranges(self, files: np.ndarray, numbers: np.ndarray) -> list[ranges.Range]:
        """(location, start, stop) of record `numbers[k]` of file `files[k]`, framing included."""
        starts, stops = self._spans(files, numbers)
        return [
            (self._locations[file], start, stop)
            for file, start, stop in zip(files.tolist(), starts.tolist(), stops.tolist(),
                                         strict=True)
        ]
