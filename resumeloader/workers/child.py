"""The worker process: produces the batches it is sent, until its parent goes away.

Started by `resumeloader.workers.processes` as ``python -c "<boot>" SOCKET_FD PARENT_PID``
with the parent's ``sys.path``: it never imports the user's ``__main__`` (so a script
without an ``if __name__ == "__main__":`` guard, or one that imports TensorFlow at the
top, costs nothing here) and imports no TensorFlow. User functions defined in
``__main__`` arrive pickled by value (cloudpickle).

The messages on the socket are those of `resumeloader.workers.messages`.

A worker writes its batches into `SLOTS` blocks that it reuses; the parent copies a
batch out when it receives the reply and never lets a worker hold more than `SLOTS`
unanswered tasks, so a block is never overwritten before it was read.

The worker exits within a fraction of a second of its parent's death, even inside a
stalled ``map_fn``: a watchdog thread polls the parent pid, and on Linux the kernel
sends SIGKILL when the thread that started it ends (``PR_SET_PDEATHSIG``, requested
only when that thread is the parent's main thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import deque
from multiprocessing import connection
from typing import Any

import numpy as np

from resumeloader.core import board as board_lib
from resumeloader.core import meters
from resumeloader.workers import failures, messages, produce, shm, timing

__all__ = ["SLOTS", "main"]

# Batches in flight per worker: one being written, one waiting to be read.
SLOTS = 2
_ALIGN = 64
_WATCH_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1


def _watch_parent(parent_pid: int) -> None:
    # Reparenting changes getppid(): the parent died (even by SIGKILL). os._exit skips
    # the interpreter's shutdown, which would wait for a stalled map_fn.
    while os.getppid() == parent_pid:
        time.sleep(_WATCH_SECONDS)
    os._exit(0)


def _exit_with_parent(parent_pid: int, deathsig: bool) -> None:
    if deathsig and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # died before the watch started
        os._exit(0)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


class _Writer:
    """The worker's `SLOTS` reusable blocks; each batch goes to the next slot in turn."""

    def __init__(self) -> None:
        self._blocks: list[shm.Block | None] = [None] * SLOTS
        self._count = 0

    def write(self, leaves: list[np.ndarray]) -> tuple[messages.Placement, shm.Block | None]:
        """Writes `leaves`; returns where, and the new block whose fd must follow."""
        slot, self._count = self._count % SLOTS, self._count + 1
        layout = []
        size = 0
        for leaf in leaves:
            layout.append((leaf.dtype.str, leaf.shape, size))
            size += -(-leaf.nbytes // _ALIGN) * _ALIGN
        block, new = self._blocks[slot], None
        if block is None or block.size < size:
            # Grow geometrically, so that a few larger batches do not recreate it each time.
            capacity = max(size, _ALIGN, 0 if block is None else 2 * block.size)
            new = shm.create(capacity)
            if block is not None:
                block.close()
            block = self._blocks[slot] = new
        for leaf, (_, shape, offset) in zip(leaves, layout, strict=True):
            target = np.ndarray(shape, dtype=leaf.dtype, buffer=block.buf, offset=offset)
            target[...] = leaf
            del target
        return messages.Placement(slot, block.size, layout, new is not None), new

    def close(self) -> None:
        for block in self._blocks:
            if block is not None:
                block.close()


def _serve(conn: connection.Connection, sock: socket.socket) -> None:
    payload = conn.recv()
    setup_error: dict[str, Any] | None = None
    try:
        pipeline, spec = pickle.loads(payload)
        board = board_lib.Board() if meters.enabled() else None
        producer = produce.BatchProducer(pipeline, spec, hand_over=False, board=board)
        report = timing.Report(board)
    except Exception as err:
        setup_error = failures.describe(err)
    conn.send(messages.Reply(-1, 0, messages.READY, None))
    writer = _Writer()
    inbox: deque[messages.TaskMessage] = deque()
    latest, stop = 0, False

    def take(message: Any) -> None:
        nonlocal latest, stop
        if message is None:
            stop = True
        elif isinstance(message, messages.SessionMessage):
            latest = max(latest, message.session)
        else:
            latest = max(latest, message.session)
            inbox.append(message)

    try:
        while True:
            if not inbox and not stop:
                take(conn.recv())
            while not stop and conn.poll():  # what waits may make queued tasks stale
                take(conn.recv())
            if stop:
                return
            if not inbox:
                continue
            seq, session, task = inbox.popleft()
            new = None
            if session < latest:
                reply = messages.Reply(seq, session, messages.SKIPPED, None)
            elif setup_error is not None:
                reply = messages.Reply(seq, session, messages.SETUP_ERROR, setup_error)
            else:
                try:
                    produced = producer.batch(task)
                    arrays, header = produced.flatten(producer.output_spec.treespec)
                    placement, new = writer.write([np.ascontiguousarray(a) for a in arrays])
                    done = messages.Done(placement, header, producer.skips.take(task),
                                         report.take())
                    reply = messages.Reply(seq, session, messages.OK, done)
                except Exception as err:
                    reply = messages.Reply(seq, session, messages.ERROR, failures.describe(err))
            conn.send(reply)
            if new is not None:
                assert new.fd is not None
                shm.send_fd(sock, new.fd)
                new.release_fd()
    finally:
        writer.close()


def main() -> None:
    """Entry point (see the module docstring); returns when the parent stops or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    fd, parent_pid, deathsig = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    _exit_with_parent(parent_pid, deathsig)
    sock = socket.socket(fileno=fd)
    conn = connection.Connection(os.dup(fd))
    try:
        _serve(conn, sock)
    except (EOFError, OSError):  # the parent closed the socket or is gone
        pass
    finally:
        conn.close()
        sock.close()
