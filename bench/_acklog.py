"""A file a producing process fills with the ids of the events it saw acknowledged.

A SIGKILL cannot lose what is in it: the file is memory-mapped shared, so every store
is in the page cache the moment it is made, and the kernel keeps it when the process
dies. The parent of a killed child reads back exactly which events the child's
application had been told were safe.

Layout (little-endian):

    offset  size  field
    0       16    count slot 0: u64 count, u64 count ^ 0xFFFF_FFFF_FFFF_FFFF
    16      16    count slot 1: the same
    32      36*N  event ids, 36 bytes of ASCII each (UUIDv7 text), in acknowledgement order

Commit-last: an id is written before the count that covers it. Count n goes to slot
n % 2, so a kill in the middle of one slot's write leaves the other slot whole, with
n - 1; a slot whose two words disagree is torn and ignored.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

ID_BYTES = 36
_SLOT = struct.Struct("<QQ")
_SLOTS_BYTES = 2 * _SLOT.size
_MASK = (1 << 64) - 1


class AckLogFullError(RuntimeError):
    """The child acknowledged more events than the file was sized for."""


class AckLog:
    """One child's acknowledged event ids, shared with its parent through a mapped file."""

    def __init__(self, path: Path, capacity: int) -> None:
        """Map `path`, creating it (sparse, zeroed: count 0) for `capacity` ids if missing."""
        self.path = path
        self.capacity = capacity
        size = _SLOTS_BYTES + capacity * ID_BYTES
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._count = self.count()

    def append(self, event_id: str) -> None:
        """Record one acknowledged event: its id first, then the count that covers it."""
        count = self._count
        if count >= self.capacity:
            raise AckLogFullError(f"{self.path} holds {self.capacity} ids; size it larger")
        start = _SLOTS_BYTES + count * ID_BYTES
        raw = event_id.encode()
        if len(raw) != ID_BYTES:
            raise ValueError(f"event id {event_id!r} is not {ID_BYTES} bytes long")
        self._map[start : start + ID_BYTES] = raw
        count += 1
        _SLOT.pack_into(self._map, (count % 2) * _SLOT.size, count, count ^ _MASK)
        self._count = count

    def count(self) -> int:
        """The highest count found in a whole slot: what the writer had committed."""
        best = 0
        for slot in (0, 1):
            value, check = _SLOT.unpack_from(self._map, slot * _SLOT.size)
            if value ^ check == _MASK and value <= self.capacity:
                best = max(best, value)
        return best

    def ids(self) -> list[str]:
        """Every committed id, in acknowledgement order."""
        count = self.count()
        raw = self._map[_SLOTS_BYTES : _SLOTS_BYTES + count * ID_BYTES]
        return [raw[i : i + ID_BYTES].decode() for i in range(0, len(raw), ID_BYTES)]

    def close(self) -> None:
        self._map.close()
