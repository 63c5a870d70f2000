"""Kafka-compatible partition selection for events leaving the spool.

Keyed events must land on the partition the Java client would pick, so that
per-key ordering and co-partitioning hold no matter which producer (Java,
librdkafka with ``partitioner=murmur2_random``, or this spool) wrote the key.
Keyless events use sticky partitioning (KIP-480) so that they fill batches
instead of scattering one-record batches over every partition. Both run in the
compiled core, on every send.
"""

from __future__ import annotations

from eventspool._core.native import StickyPartitioner, murmur2, partition_for_key

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]
