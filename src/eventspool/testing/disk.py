"""A small disk of its own (a tmpfs), and a ballast file that leaves it nearly full.

A real file system that runs out of space is the only honest test of ENOSPC: the spool
preallocates its queue files (`posix_fallocate`), so a queue that exists keeps working
on a full disk and a new one fails cleanly at creation. Mounting needs CAP_SYS_ADMIN;
without it `SmallDisk` raises `DiskUnavailableError` with the reason, for a skip.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["DiskUnavailableError", "SmallDisk"]

_COMMAND_TIMEOUT_S = 30.0
_PAGE = 4096


class DiskUnavailableError(RuntimeError):
    """No small disk can be mounted here; the message says why."""


class SmallDisk:
    """A tmpfs of `size_bytes` mounted on `mountpoint` (created if missing) until `close()`."""

    def __init__(self, mountpoint: Path, size_bytes: int) -> None:
        self.path = mountpoint
        self.size_bytes = size_bytes
        self.ballast = mountpoint / "ballast"
        mountpoint.mkdir(parents=True, exist_ok=True)
        try:
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint)],
                capture_output=True,
                timeout=_COMMAND_TIMEOUT_S,
                check=False,
            )
        except FileNotFoundError as exc:
            raise DiskUnavailableError("no mount command here, so no small tmpfs") from exc
        if mounted.returncode != 0:
            raise DiskUnavailableError(
                "mounting a tmpfs is not permitted here (needs CAP_SYS_ADMIN): "
                + mounted.stderr.decode(errors="replace").strip()
            )
        self._mounted = True

    def free_bytes(self) -> int:
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def fill(self, leave_bytes: int) -> int:
        """Allocate a ballast file so that at most `leave_bytes` stay free; its size.

        Allocated, not sparse: tmpfs counts the pages, and other writers see ENOSPC.
        Space freed meanwhile by another writer is taken too, a page at a time.
        """
        size = 0
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while (want := self.free_bytes() - leave_bytes) >= _PAGE:
                try:
                    os.posix_fallocate(fd, size, want - want % _PAGE)
                    size += want - want % _PAGE
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    leave_bytes += _PAGE  # another writer took some meanwhile
        finally:
            os.close(fd)
        return size

    def empty(self) -> None:
        """Remove the ballast: the disk has its space back."""
        self.ballast.unlink(missing_ok=True)

    def close(self) -> None:
        """Unmount (lazily: a process may still hold a file there); idempotent."""
        if self._mounted:
            self._mounted = False
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    ["umount", "-l", str(self.path)], check=False, timeout=_COMMAND_TIMEOUT_S
                )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
