"""The small disk and its ballast: the soak's disk-full fault must really leave no room."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from eventspool.testing.disk import SmallDisk
from tests.conftest import SmallDiskFactory

MIB = 1024 * 1024


@pytest.fixture
def disk(tmp_path: Path, small_disk: SmallDiskFactory) -> SmallDisk:
    return small_disk(tmp_path / "disk", 4 * MIB)


def _preallocate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def test_ballast_leaves_no_room_for_a_new_file_but_keeps_old_ones_writable(
    disk: SmallDisk,
) -> None:
    existing = disk.path / "existing"
    _preallocate(existing, 256 * 1024)
    ballast = disk.fill(leave_bytes=16 * 1024)
    assert ballast > 3 * MIB
    assert disk.free_bytes() <= 16 * 1024

    with pytest.raises(OSError) as caught:
        _preallocate(disk.path / "new", 64 * 1024)
    assert caught.value.errno == errno.ENOSPC
    with existing.open("r+b") as handle:
        handle.write(b"x" * 200 * 1024)  # into allocated pages: no new space needed

    disk.empty()
    assert disk.free_bytes() > 3 * MIB
    _preallocate(disk.path / "new", 64 * 1024)
