"""Exceptions raised by resumeloader.

Every library error subclasses the built-in exception it refines, so code that
already catches ``ValueError`` or ``RuntimeError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "ElasticResumeError",
    "HarnessError",
    "RecordError",
    "RecordSpecError",
    "ResumeLoaderError",
    "ResumeMismatchError",
    "StateError",
    "StateMismatchError",
    "StreamIntegrityError",
    "WorkerError",
]


class ResumeLoaderError(Exception):
    """Base class of every error raised by resumeloader itself."""


class StateError(ResumeLoaderError, ValueError):
    """A loader state dict is malformed, corrupted or of an unknown version."""


class StateMismatchError(StateError):
    """A state was saved by a loader whose record order differs from this one.

    The message names every differing field, one per line. Nothing has been
    changed when it is raised.
    """


class ElasticResumeError(StateError):
    """A state cannot be continued exactly with the new shard layout.

    Raised, for example, when the saved global offset is not divisible by the new
    ``shard_count``: continuing would silently skip or repeat records.
    """


class StreamIntegrityError(ResumeLoaderError, RuntimeError):
    """The loader's batches are consumed in a way that would lose or repeat records.

    Raised at the first moment it can be detected, before the position moves: a
    tf.data transformation after ``dataset()`` that drops, repeats, reorders or
    regroups batches; a second live iterator on one loader; a position change
    during a live ``for batch in loader``; an advance past what the loader produced.
    The message names the cause and what to write instead.
    """


class RecordError(ResumeLoaderError, RuntimeError):
    """User code (a source or a ``map_fn``) failed on one record.

    Attributes:
        record_index: index of the record in the source.
        epoch: the epoch being produced.
        position: the loader position (this shard's records, across epochs).
    """

    def __init__(self, msg: str, *, record_index: int, epoch: int, position: int) -> None:
        super().__init__(msg)
        self.record_index = record_index
        self.epoch = epoch
        self.position = position


class RecordSpecError(RecordError, ValueError):
    """A record's structure, dtype or shape differs from the element spec."""


class WorkerError(RecordError):
    """A worker thread or process died while preparing a record."""


class ResumeMismatchError(ResumeLoaderError, AssertionError):
    """A resumed stream differs from the uninterrupted one (raised by `resumeloader.testing`).

    The message names the first differing step, what was expected and what came.
    """


class HarnessError(ResumeLoaderError, RuntimeError):
    """The kill-and-restart harness could not run the training command to the end."""
