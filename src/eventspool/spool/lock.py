"""One owner per spool directory.

`fcntl.flock` on a lock file: the kernel releases it when the owner dies, even by
SIGKILL, so a restart never has to clean up by hand. (`lockf` locks are per process
and silently dropped when any descriptor of the file is closed: unsafe here.)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from eventspool.errors import SpoolLockedError

LOCK_FILE = "LOCK"


class OwnerLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise SpoolLockedError(
                f"spool directory {directory} is already owned by another process "
                f"(pid {owner}); stop it, or use a different directory"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd < 0:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1


def is_locked(directory: Path) -> int | None:
    """The pid of the live owner of `directory`, or None when nobody holds it."""
    path = directory / LOCK_FILE
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
