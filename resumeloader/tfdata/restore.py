"""`restore(manager, loader)`: restore a checkpoint only if it holds the loader's state.

``CheckpointManager.restore_or_initialize()`` restores whatever the checkpoint holds:
one saved without the loader (an older script, another key) restores the model and
silently leaves the data at position 0, so the job trains its first batches again.
`restore` checks, before anything changes, that the checkpoint holds a state at the
place where the manager's checkpoint tracks the loader.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from resumeloader import errors
from resumeloader.core import validate
from resumeloader.tfdata import loader as loader_lib

__all__ = ["check_tracks_loader", "checked_path", "restore"]

_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def check_tracks_loader(manager: tf.train.CheckpointManager, loader: Any) -> None:
    """Raises ValueError unless `manager`'s checkpoint tracks `loader`."""
    tracked = tf.train.TrackableView(manager.checkpoint).descendants()
    if not any(obj is loader for obj in tracked):
        msg = (
            "The CheckpointManager's checkpoint does not track the loader, so saving it "
            "would not save the loader's position. Create it as tf.train.Checkpoint("
            f"model=..., optimizer=..., loader=loader). Received: loader={loader!r}."
        )
        raise ValueError(msg)


def _holds_state(path: str, root: Any, loader: Any) -> bool:
    """Whether the checkpoint at `path` has attributes for `loader`, matched from `root`
    through the checkpoint's object graph the way TensorFlow matches a restore."""
    return bool(_attributes(path, root, loader))


def _saved_state(path: str, root: Any, loader: Any) -> Any:
    """The loader state the checkpoint at `path` holds for `loader` (its JSON text)."""
    [attribute] = _attributes(path, root, loader)
    return tf.train.load_checkpoint(path).get_tensor(attribute.checkpoint_key)


def _attributes(path: str, root: Any, loader: Any) -> list[Any]:
    """The checkpoint's attributes of `loader` (see `_holds_state`); [] for none."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor(_GRAPH_KEY))
    queue, seen = [(root, 0)], {id(root)}
    while queue:
        obj, node_id = queue.pop(0)
        node = graph.nodes[node_id]
        if obj is loader:
            return list(node.attributes)
        saved = {child.local_name: child.node_id for child in node.children}
        for name, child in tf.train.TrackableView(obj).children(obj).items():
            if name in saved and id(child) not in seen:
                seen.add(id(child))
                queue.append((child, saved[name]))
    return []


def restore(
    manager: tf.train.CheckpointManager,
    loader: loader_lib.ResumableLoader,
    *,
    path: str | None = None,
    start_prefetch: bool = False,
) -> str | None:
    """Restores `manager`'s latest checkpoint (or `path`), refusing one without the loader.

    Use it where ``manager.restore_or_initialize()`` or ``checkpoint.restore(
    manager.latest_checkpoint)`` would go. Guarantees: nothing is restored unless the
    checkpoint holds a state for `loader` (at the place where the manager's
    checkpoint tracks it), so a model never continues while its data restarts.

    Args:
        manager: a `tf.train.CheckpointManager` whose checkpoint tracks `loader`.
        loader: the `ResumableLoader` whose position the checkpoint must hold.
        path: a checkpoint to restore instead of the latest one.
        start_prefetch: restore the loader's state first and start making the batches
            of the next ``for batch in loader`` (`ResumableLoader.start_prefetch`)
            while the rest of the checkpoint (the model) is restored. On a fresh start
            (no checkpoint) they start from the loader's current position.

    Returns:
        The path restored, or None when there is no checkpoint yet (a fresh start).

    Raises:
        TypeError: `manager` or `loader` is of the wrong type.
        ValueError: the manager's checkpoint does not track `loader`.
        StateError: the checkpoint holds no state for `loader`.

    Examples:
        >>> import tempfile
        >>> import numpy as np, tensorflow as tf
        >>> from resumeloader import ResumableLoader
        >>> loader = ResumableLoader(np.arange(10), batch_size=2, seed=0)
        >>> step = tf.Variable(0)
        >>> directory = tempfile.mkdtemp()
        >>> old = tf.train.CheckpointManager(tf.train.Checkpoint(step=step), directory, 1)
        >>> _ = old.save()   # a checkpoint written without the loader
        >>> manager = tf.train.CheckpointManager(
        ...     tf.train.Checkpoint(step=step, loader=loader), directory, 1)
        >>> restore(manager, loader)
        Traceback (most recent call last):
        ...
        resumeloader.errors.StateError: The checkpoint ... holds no state for the loader ...
    """
    validate.boolean("start_prefetch", start_prefetch)
    path = checked_path(manager, loader, path=path)
    if path is not None and start_prefetch:
        loader.set_state(_saved_state(path, manager.checkpoint, loader).decode())
    if start_prefetch:
        loader.start_prefetch()
    if path is not None:
        manager.checkpoint.restore(path)  # the loader again: the same position, kept
    return path


def checked_path(
    manager: tf.train.CheckpointManager,
    loader: loader_lib.ResumableLoader,
    *,
    path: str | None = None,
) -> str | None:
    """The checkpoint `restore` would restore (None if there is none), checked, unrestored.

    Raises:
        TypeError, ValueError, StateError: as `restore`.
    """
    if not isinstance(manager, tf.train.CheckpointManager):
        msg = (
            "`manager` must be a tf.train.CheckpointManager. "
            f"Received: manager={manager!r:.80} of type {type(manager).__name__}."
        )
        raise TypeError(msg)
    if not isinstance(loader, loader_lib.ResumableLoader):
        msg = f"`loader` must be a ResumableLoader. Received: loader={loader!r:.80}."
        raise TypeError(msg)
    check_tracks_loader(manager, loader)
    path = manager.latest_checkpoint if path is None else path
    if path is None:
        return None
    if not _holds_state(path, manager.checkpoint, loader):
        msg = (
            f"The checkpoint {path} holds no state for the loader (it was saved without it, "
            "or under another name): restoring it would continue the model while the data "
            "restarts from the loader's current position, repeating or skipping records. "
            "Save the loader in the same tf.train.Checkpoint as the model (loader=loader), "
            f"or start from a new directory. Received: loader={loader!r}."
        )
        raise errors.StateError(msg)
    return path
