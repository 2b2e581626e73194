"""Anonymous shared memory: nothing named in /dev/shm, descriptors passed, space checked."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from resumeloader.workers import shm


def _target(block: shm.Block) -> str:
    assert block.fd is not None
    return os.readlink(f"/proc/self/fd/{block.fd}")


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")
def test_create_default_block_is_a_memfd_without_a_name():
    """The default block is a memfd: it has no name anywhere, so nothing can leak."""
    block = shm.create(4096)
    try:
        assert _target(block).startswith("/memfd:resumeloader-batch")
    finally:
        block.close()


def test_create_file_block_is_unlinked_before_use():
    """The file fallback's block is unlinked as soon as it exists: no name outlives it."""
    block = shm.create(4096, use_memfd=False)
    try:
        target = _target(block)
        assert target.startswith(shm.shm_directory())
        assert target.endswith(" (deleted)")
        assert not os.path.exists(target.removesuffix(" (deleted)"))
    finally:
        block.close()


@pytest.mark.parametrize("use_memfd", [True, False], ids=["memfd", "file"])
def test_block_passed_over_socket_shares_its_memory(use_memfd):
    """A block's descriptor sent over a Unix socket maps the same memory on the other end."""
    mine, theirs = socket.socketpair()
    block = shm.create(4096, use_memfd=use_memfd)
    try:
        assert block.fd is not None
        shm.send_fd(mine, block.fd)
        block.release_fd()
        received = shm.Block(shm.receive_fd(theirs), 4096)
        block.buf[:5] = b"batch"
        assert received.buf[:5] == b"batch"
        received.close()
    finally:
        block.close()
        mine.close()
        theirs.close()


def test_check_space_beyond_free_raises_naming_directory_size_and_remedies():
    """A request larger than /dev/shm's free space is an ENOSPC error saying what to do."""
    directory = shm.shm_directory()
    stats = os.statvfs(directory)
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    with pytest.raises(OSError) as excinfo:
        shm.check_space(directory, free + (1 << 30))
    message = str(excinfo.value)
    assert excinfo.value.errno == errno.ENOSPC
    assert f"{directory} has {free / (1 << 20):.1f} MiB free of {total / (1 << 20):.1f} MiB" in (
        message
    )
    for remedy in ("--shm-size", "smaller batches", "Workers(kind='thread')"):
        assert remedy in message


def test_create_file_block_beyond_free_space_raises_before_writing():
    """The file fallback refuses a block /dev/shm cannot hold instead of dying of SIGBUS later."""
    directory = shm.shm_directory()
    stats = os.statvfs(directory)
    before = set(os.listdir(directory))
    with pytest.raises(OSError) as excinfo:
        shm.create(stats.f_bavail * stats.f_frsize + (1 << 30), use_memfd=False)
    assert excinfo.value.errno == errno.ENOSPC
    mine = f"rl{os.getpid()}_"
    assert {n for n in set(os.listdir(directory)) - before if n.startswith(mine)} == set()
