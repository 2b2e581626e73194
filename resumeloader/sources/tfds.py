"""`TFDSSource`: a tfds data source, identified by builder, version, split and files.

A tfds data source is read like any ``len()`` + ``__getitems__`` object
(`IndexableSource`); what this adds is its identity: the builder's name and version,
the split (with its slicing, e.g. ``train[:1000]``), the file instructions the split
resolves to (each file's name, its first record and how many records it gives) and
how records are deserialized. ``train[:1000]`` and ``train[1000:2000]`` have as many
records and different identities. Recognised by its type's module; tensorflow-datasets
is never imported here.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from resumeloader.sources import indexable

__all__ = ["TFDSSource", "accepts", "identity"]


def accepts(source: Any) -> bool:
    """A tfds data source: a ``tensorflow_datasets`` object with ``dataset_info`` and ``split``."""
    return (
        type(source).__module__.startswith("tensorflow_datasets.")
        and hasattr(source, "dataset_info")
        and hasattr(source, "split")
    )


def identity(source: Any) -> str:
    """``"tfds <builder>/<version> <split> <digest of the file instructions>"``."""
    info = source.dataset_info
    split = source.split
    instructions = info.splits[split].file_instructions if split is not None else []
    files = [
        f"{os.path.basename(os.fspath(fi.filename))}:{fi.skip}:{fi.take}:{fi.examples_in_shard}"
        for fi in instructions
    ]
    method = getattr(source, "deserialize_method", None)
    decoders = getattr(source, "decoders", None)
    text = "\n".join([*files, str(method), "" if decoders is None else repr(decoders)])
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
    name = getattr(info, "full_name", None) or f"{info.name}/{info.version}"
    return indexable.bounded(f"tfds {name} {split} {digest}")


class TFDSSource(indexable.IndexableSource):
    """A tfds data source read by batch (``__getitems__``), identified by `identity`."""

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        name = source.dataset_info.name
        self.description = f"tfds {type(source).__name__}({name}, {source.split})"

    def _find_identity(self, source: Any) -> str | None:
        return identity(source)
