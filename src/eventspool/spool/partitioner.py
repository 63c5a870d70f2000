"""Kafka-compatible partition selection for events leaving the spool.

Keyed events must land on the partition the Java client would pick, so that
per-key ordering and co-partitioning hold no matter which producer (Java,
librdkafka with ``partitioner=murmur2_random``, or this spool) wrote the key.
Keyless events use sticky partitioning (KIP-480) so that they fill batches
instead of scattering one-record batches over every partition.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Collection, Sequence
from typing import Final

__all__ = [
    "KEY_CACHE_MAX_ENTRIES",
    "StickyPartitioner",
    "murmur2",
    "partition_for_key",
    "to_positive",
]

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
_MASK32: Final = 0xFFFFFFFF
_SIGN_BIT: Final = 0x80000000
_POSITIVE_MASK: Final = 0x7FFFFFFF

KEY_CACHE_MAX_ENTRIES: Final = 65536
"""Bound on the key-hash memo: many distinct keys must not grow memory without limit."""

# Key bytes -> to_positive(murmur2(key)). A plain dict measured faster than
# functools.lru_cache on hits; it is emptied wholesale when full because
# exact LRU bookkeeping would cost more on the hot path than it saves.
_key_hash_cache: dict[bytes, int] = {}


def murmur2(data: bytes) -> int:
    """Hash like Kafka's Java ``Utils.murmur2``, as a signed 32-bit int.

    The exact Java result (including its sign) matters: any deviation sends
    keys to partitions other producers would not choose.
    """
    length = len(data)
    h = _SEED ^ length
    blocks = length >> 2
    if blocks:
        for block in struct.unpack_from(f"<{blocks}I", data):
            k = (block * _M) & _MASK32
            k ^= k >> _R
            h = ((h * _M) & _MASK32) ^ ((k * _M) & _MASK32)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - 0x100000000 if h & _SIGN_BIT else h


def to_positive(n: int) -> int:
    """Clear the sign bit like Kafka's ``Utils.toPositive``.

    ``abs()`` would differ for negative hashes (and Java's abs overflows on
    MIN_VALUE), so Kafka masks instead and so must we.
    """
    return n & _POSITIVE_MASK


def partition_for_key(key: bytes, partition_count: int) -> int:
    """Choose the partition Kafka's default partitioner picks for ``key``.

    Memoised because keys such as user ids repeat heavily and the pure-Python
    hash costs about a microsecond. The memo is safe to share between threads:
    at worst a racing clear drops an entry that is recomputed later.
    """
    if partition_count < 1:
        raise ValueError(f"partition_count must be at least 1, got {partition_count}")
    try:
        positive = _key_hash_cache[key]
    except KeyError:
        if len(_key_hash_cache) >= KEY_CACHE_MAX_ENTRIES:
            _key_hash_cache.clear()
        positive = _key_hash_cache[key] = murmur2(key) & _POSITIVE_MASK
    return positive % partition_count


def _eligible(partition_count: int, available: Collection[int] | None) -> Sequence[int]:
    """Return the partitions a switch may choose from, without duplicates.

    Kafka falls back to every partition when none has a live leader, since
    queueing on any partition beats rejecting the event.
    """
    if available:
        usable = sorted({p for p in available if 0 <= p < partition_count})
        if usable:
            return usable
    return range(partition_count)


class StickyPartitioner:
    """Spread keyless events like Kafka's built-in sticky partitioner (KIP-480).

    Sticking to one partition until about ``batch_bytes`` have gone to it
    yields full batches (fewer requests, better compression) while random
    switching still spreads load over time. A switch prefers a partition other
    than the current one, when there is a choice, so that a full batch is
    not followed by more data for the same partition.

    Not thread-safe: callers that share one instance must hold a lock around
    :meth:`partition`.
    """

    __slots__ = ("_batch_bytes", "_current", "_produced", "_rng")

    def __init__(self, batch_bytes: int = 16384, rng: random.Random | None = None) -> None:
        if batch_bytes < 1:
            raise ValueError(f"batch_bytes must be at least 1, got {batch_bytes}")
        self._batch_bytes = batch_bytes
        self._rng = rng if rng is not None else random.Random()
        self._current = -1
        self._produced = 0

    @property
    def batch_bytes(self) -> int:
        """Byte budget per sticky partition, exposed so callers can log or tune it."""
        return self._batch_bytes

    def partition(
        self, partition_count: int, size: int, available: Collection[int] | None = None
    ) -> int:
        """Return the partition for a keyless event of ``size`` bytes.

        ``available`` lists partitions whose leader is reachable; an empty or
        missing list means "no information", so every partition is allowed.
        The event that reaches ``batch_bytes`` still goes to the current
        partition (as in Kafka); the next event triggers the switch.
        """
        if partition_count < 1:
            raise ValueError(f"partition_count must be at least 1, got {partition_count}")
        if size < 0:
            raise ValueError(f"size must not be negative, got {size}")
        current = self._current
        if not (
            self._produced < self._batch_bytes
            and 0 <= current < partition_count
            and (not available or current in available)
        ):
            eligible = _eligible(partition_count, available)
            if self._produced >= self._batch_bytes or current not in eligible:
                current = self._pick(eligible, current)
                self._current = current
                self._produced = 0
        self._produced += size
        return current

    def _pick(self, eligible: Sequence[int], current: int) -> int:
        """Draw uniformly among ``eligible``, excluding ``current`` when possible."""
        count = len(eligible)
        if count == 1:
            return eligible[0]
        if current not in eligible:
            return eligible[self._rng.randrange(count)]
        # Draw from the first count-1 slots and let the last slot stand in
        # for the current partition: uniform over the others, one draw only.
        choice = eligible[self._rng.randrange(count - 1)]
        return eligible[count - 1] if choice == current else choice
