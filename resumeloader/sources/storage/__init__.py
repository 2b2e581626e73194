"""Byte storage for file-backed sources: where bytes live and how they are read (no record format).

Local files and objects behind URLs (``s3://``, ``gs://``, ``http(s)://``,
``memory://``) named and found (`locations`, `objects`, `filesystems`), read by byte
ranges (`ranges`: coalesced preads through the bounded cache of open files,
`handles`; ranged GETs pinned to each object's version, merged, retried, cached and
read ahead, `fetch` with `protocols`, `retry` and `spans`), whole objects copied
locally for readers that need a path (`object_cache`), facts about files remembered to
name what changed (`remembered`), and the option values (`options`: `Storage`,
`ObjectReads`). Record formats live one level up (`resumeloader.sources`) and import
this package; it imports none of them. Importing it imports no storage library
(fsspec, s3fs, gcsfs are imported when an object is first reached).
"""
