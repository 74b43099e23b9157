"""Exclusive lock files that the kernel releases when their holder ends, however it ends (SIGKILL included):
one writer per run directory (`jaxlm.train.run_lock`) and per prepared data directory (`jaxlm.data.prepare`)."""
from __future__ import annotations

import fcntl
import os
import pathlib
import socket


def take(lock: pathlib.Path) -> tuple[int | None, str]:
    """(the open lock file, "") once the lock is ours, the file then naming this process; (None, who holds it)
    when another process does. Its folder is made if need be. A holder may delete the file before it lets go
    (`release`): the lock is taken only on the file that is at the path once it is held."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            return None, holder or "another process"
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # its holder deleted it as we opened it: take the one at the path now
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}".encode(), 0)
    return fd, ""


def release(lock: pathlib.Path, fd: int) -> None:
    """Deletes the lock file `take` gave `fd` for, then lets go of it."""
    os.unlink(lock)
    os.close(fd)
