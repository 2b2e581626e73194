"""One worker process as the pool sees it: started, fed, read from, stopped.

The process runs `resumeloader.workers.child` in a fresh interpreter started with
``python -c`` and the parent's ``sys.path`` (not `multiprocessing`'s spawn, which
re-imports the user's ``__main__`` in every worker). Replies arrive on a Unix socket;
a reply that hands over a new block of shared memory is followed by its file
descriptor. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing import connection, spawn

from resumeloader.workers import messages, shm

__all__ = ["WorkerProcess", "shutdown"]

# On shutdown an idle worker exits at once (its socket closes); a busy one is killed.
GRACE_SECONDS = 0.1
#: How long a killed worker is waited for. It runs in a loader's finalizer, which may run
#: inside a garbage collection: an unbounded wait there (a process stuck in the kernel)
#: would stop every later collection of the process. One not gone by then is left.
_KILLED_SECONDS = 5.0
_BOOT = "import sys; sys.path[:] = {path!r}; from resumeloader.workers import child; child.main()"
_HINTS = {
    "SIGKILL": " (also what the kernel's out-of-memory killer sends)",
    "SIGBUS": " (usually shared memory exhausted)",
}


class WorkerProcess:
    """One worker process, its socket and the blocks of shared memory it wrote into.

    Args:
        index: its number in the pool (for messages).
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.outstanding: deque[int] = deque()  # tasks sent and not yet answered, in order
        self.blocks: dict[int, shm.Block] = {}
        self.dead = False
        self.ready = False  # set up: its batches can be timed
        self.sock, theirs = socket.socketpair()
        # The kernel's parent-death signal follows the thread that started the process:
        # ask for it only when that thread is the main one (the watchdog covers the rest).
        deathsig = threading.current_thread() is threading.main_thread()
        command = [
            spawn.get_executable(), "-c", _BOOT.format(path=list(sys.path)),
            str(theirs.fileno()), str(os.getpid()), "1" if deathsig else "0",
        ]
        try:
            self.popen = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self.conn = connection.Connection(os.dup(self.sock.fileno()))

    def setup(self, payload: bytes) -> None:
        """Sends the pickled pipeline (waits until the new process reads it)."""
        with contextlib.suppress(OSError):  # a worker that died is reported when awaited
            self.conn.send(payload)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def receive(self) -> messages.Reply:
        """The next reply; maps the block whose descriptor follows an `OK` reply."""
        reply: messages.Reply = self.conn.recv()
        if reply.kind == messages.OK and reply.body.placement.new_block:
            placement = reply.body.placement
            block = shm.Block(shm.receive_fd(self.sock), placement.size)
            block.release_fd()
            old = self.blocks.pop(placement.slot, None)
            if old is not None:
                old.close()
            self.blocks[placement.slot] = block
        return reply

    def how_it_died(self) -> str:
        code = self.popen.returncode
        if code is None or code >= 0:
            return f"exit code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
        return f"signal {name}{_HINTS.get(name, '')}"

    def stop(self, *, kill: bool = False, grace: float = GRACE_SECONDS) -> None:
        """Closes the socket (an idle worker exits), waits up to `grace`, then kills it."""
        self.dead = True
        if kill:
            self.popen.kill()
        self.conn.close()
        self.sock.close()
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(_KILLED_SECONDS)
        for block in self.blocks.values():
            block.close()
        self.blocks.clear()


def shutdown(workers: list[WorkerProcess]) -> None:
    """Stops `workers` in parallel: idle ones exit at once, busy ones are killed after 0.1 s."""
    for worker in workers:  # all sockets first: the workers stop in parallel
        worker.conn.close()
    deadline = time.monotonic() + GRACE_SECONDS
    for worker in workers:
        worker.stop(grace=max(0.0, deadline - time.monotonic()))


