"""``resumeloader index URL...``: TFRecord offset indexes built once, kept next to the data.

For each object named (a URL, or a glob of URLs) the index is built with one
sequential read and written next to it as a *sidecar* (the object's URL plus
``.rlidx``, `resumeloader.sources.remote_index`), so that any machine that builds a
`TFRecordSource` of those objects later reads one small sidecar per object instead
of the objects themselves. For local files the index is built into the local index
folder (what the first `TFRecordSource` of them would do). Credentials and endpoints
come from the standard environment (``AWS_ENDPOINT_URL``, ``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from resumeloader.sources import remote_index
from resumeloader.sources import tfrecord_index as index_lib
from resumeloader.sources.storage import locations, objects, options

__all__ = ["main"]


def main(
    paths: Sequence[str], out: Any, *, index_dir: str | None = None, err: Any = None
) -> int:
    """Indexes every TFRecord file or object `paths` names; prints one line per file on
    `out` and, given a console `err`, a progress bar of files and records on it."""
    folder = index_dir or index_lib.default_dir()
    reads = options.ObjectReads()

    def index(location: locations.Location) -> tuple[str, int]:
        if isinstance(location, objects.Object):
            url, count = remote_index.write_sidecar(location, reads)
            return f"{objects.display_url(location.url)}: {count} records -> {url}", count
        count = len(index_lib.load_or_build(location.path, folder).offsets)
        stored = index_lib.cache_path(location.path, folder)
        return f"{locations.display(location.path)}: {count} records -> {stored}", count

    done = records = 0
    found = locations.expand(list(paths), "TFRecord")
    progress = Progress(
        TextColumn("indexing"), BarColumn(), MofNCompleteColumn(), TextColumn("files,"),
        TextColumn("{task.fields[records]:,} records"), TimeElapsedColumn(),
        console=err, disable=err is None,
    )
    with progress, futures.ThreadPoolExecutor(
        max(1, min(reads.concurrency, len(found)))
    ) as pool:
        bar = progress.add_task("indexing", total=len(found), records=0)
        for line, count in pool.map(index, found):  # in order, several at once
            out.print(line, soft_wrap=True)
            done, records = done + 1, records + count
            progress.update(bar, completed=done, records=records)
    kind = "object" if done == 1 else "objects"
    out.print(f"indexed {done} {kind}, {records} records")
    return 0
