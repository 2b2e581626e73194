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
from typing import Any

from resumeloader.sources import fetch, remote_index, storage
from resumeloader.sources import files as files_lib
from resumeloader.sources import tfrecord_index as index_lib

__all__ = ["main"]


def main(paths: Sequence[str], out: Any, *, index_dir: str | None = None) -> int:
    """Indexes every TFRecord file or object `paths` names; prints one line per file."""
    folder = index_dir or index_lib.default_dir()
    reads = fetch.ObjectReads()
    objects = records = 0
    for location in files_lib.expand_locations(list(paths), "TFRecord"):
        if isinstance(location, storage.Object):
            url, count = remote_index.write_sidecar(location, reads)
            line = f"{storage.display_url(location.url)}: {count} records -> {url}"
            out.print(line, soft_wrap=True)
        else:
            count = len(index_lib.load_or_build(location, folder).offsets)
            stored = index_lib.cache_path(location, folder)
            line = f"{files_lib.display(location)}: {count} records -> {stored}"
            out.print(line, soft_wrap=True)
        objects, records = objects + 1, records + count
    kind = "object" if objects == 1 else "objects"
    out.print(f"indexed {objects} {kind}, {records} records")
    return 0
