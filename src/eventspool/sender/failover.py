"""Keyless failover: when a queue's keyless events leave its partition, and the move.

A partition unavailable (health.py) for `keyless_failover_s` has its queued keyless
events moved to the available partitions of its topic. The queue's events in flight
stay with librdkafka (it cannot take back one partition's) and are delivered when the
partition recovers: a keyless one moved meanwhile then arrives twice. The queue is
parked until then, so its keyed events wait on disk: their partition is their order.
"""

from __future__ import annotations

import enum
import logging

from eventspool.sender.health import PartitionHealth
from eventspool.spool.registry import QueueRegistry

log = logging.getLogger(__name__)


class FailoverStep(enum.Enum):
    RESUME = "resume"  # the partition is available: produce from the queue again
    WAIT = "wait"
    MOVE = "move"  # move the queue's keyless events away, and park it


def failover_step(
    *,
    unavailable_s: float,
    failover_after_s: float,
    depth: int,
    parked: bool,
    moved_until: int,
    next_seq: int,
) -> FailoverStep:
    """What to do with one queue whose partition has been unavailable `unavailable_s`.

    A parked queue moves again only what was queued after its last move (`moved_until`).
    """
    if not unavailable_s:
        return FailoverStep.RESUME
    if unavailable_s < failover_after_s or not depth:
        return FailoverStep.WAIT
    if parked and next_seq == moved_until:
        return FailoverStep.WAIT
    return FailoverStep.MOVE


def move_keyless(
    registry: QueueRegistry,
    health: PartitionHealth,
    topic_name: str,
    partition: int,
    unavailable_s: float,
) -> int | None:
    """Move the keyless events queued on `partition` to the available partitions of its
    topic: how many moved, or None when there is nowhere to move them yet."""
    topic = registry.topic(topic_name)
    if topic.partition_count is None:
        return None
    targets = sorted(health.available(topic.name, topic.partition_count))
    if not targets:
        return None
    moved = registry.move_keyless(topic.name, partition, targets)
    if moved:
        log.warning(
            "partition %s/%d has had no available leader for %.0f s: moved its %d "
            "queued keyless events to partitions %s; its keyed events wait for it",
            topic.name,
            partition,
            unavailable_s,
            moved,
            targets,
        )
    return moved
