"""Anonymous shared memory: blocks that no process death can leak.

A batch travels from a worker process to the loader's process through a block of
shared memory that has **no name**: on Linux a ``memfd`` (``os.memfd_create``),
elsewhere a file created in ``/dev/shm`` (or the temporary directory) and unlinked
before it is used. Only its file descriptor crosses the process boundary, passed over
the worker's Unix socket (``SCM_RIGHTS``). The kernel frees a block when the last
process that maps it is gone, so a SIGKILL of the whole process group, the
out-of-memory killer or a power-cut of the job leaves nothing in ``/dev/shm``: there
is nothing to unlink and no resource tracker to rely on.

A ``memfd`` is not charged to ``/dev/shm``'s size (Docker's default is 64 MiB), so
it needs no space check. The file fallback is: a tmpfs that is too small would kill
the writer with SIGBUS, so its free space is checked first and an `OSError` (ENOSPC)
says what to do. Pure Python, no TensorFlow.
"""

from __future__ import annotations

import errno
import mmap
import os
import socket
import tempfile

__all__ = ["Block", "check_space", "create", "receive_fd", "send_fd", "shm_directory"]

_MIB = 1 << 20


def shm_directory() -> str:
    """Where file-backed blocks are created: ``/dev/shm`` when it exists, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def check_space(directory: str, size: int) -> None:
    """Raises `OSError` (ENOSPC) when `directory` has less than `size` bytes free.

    The message names the directory, its size and free space, and the remedies.
    """
    stats = os.statvfs(directory)
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    if size <= free:
        return
    msg = (
        f"A batch needs {size / _MIB:.1f} MiB of shared memory but {directory} has "
        f"{free / _MIB:.1f} MiB free of {total / _MIB:.1f} MiB. Docker gives containers a "
        "64 MiB /dev/shm by default: start the container with a larger one "
        "(`docker run --shm-size=2g ...`, or `shm_size` in compose / Kubernetes' "
        "`emptyDir: {medium: Memory}`), use smaller batches, or use "
        "Workers(kind='thread')."
    )
    raise OSError(errno.ENOSPC, msg)


class Block:
    """A shared-memory block mapped into this process.

    Args:
        fd: a file descriptor of the memory (kept open: send it with `send_fd`, then
            call `release_fd`; the mapping stays valid).
        size: its size in bytes.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd: int | None = fd
        self.size = size
        self.buf = mmap.mmap(fd, size)

    def release_fd(self) -> None:
        """Closes the descriptor; the mapping keeps the memory alive."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Unmaps the block (the memory is freed once no process maps it)."""
        self.release_fd()
        self.buf.close()


def create(size: int, *, use_memfd: bool = True) -> Block:
    """A new anonymous block of `size` bytes (> 0), see the module docstring.

    Raises:
        OSError: ENOSPC when the file fallback's directory lacks the space.
    """
    if use_memfd and hasattr(os, "memfd_create"):
        fd = os.memfd_create("resumeloader-batch", os.MFD_CLOEXEC)
    else:
        directory = shm_directory()
        check_space(directory, size)
        fd, path = tempfile.mkstemp(prefix=f"rl{os.getpid()}_", dir=directory)
        os.unlink(path)  # from here on no name exists that a crash could leave behind
    try:
        os.ftruncate(fd, size)
        return Block(fd, size)
    except BaseException:
        os.close(fd)
        raise


def send_fd(sock: socket.socket, fd: int) -> None:
    """Sends a file descriptor (one byte carrying it) over a Unix socket."""
    socket.send_fds(sock, [b"\0"], [fd])


def receive_fd(sock: socket.socket) -> int:
    """Receives a file descriptor sent by `send_fd`."""
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(fds) != 1:
        msg = "Expected one file descriptor from the worker process, received none."
        raise EOFError(msg)
    return fds[0]
