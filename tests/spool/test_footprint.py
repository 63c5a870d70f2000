"""What a spool takes on disk at rest: queue files sized by their backlog, not fixed."""

from __future__ import annotations

from pathlib import Path

from eventspool import Spool

MIB = 1024 * 1024
TOPICS = 5
PARTITIONS = 4
EVENTS_PER_PARTITION = 1000


def test_twenty_partitions_of_a_thousand_events_take_under_100_mib(tmp_path: Path) -> None:
    """5 topics x 4 partitions x 1,000 events of 100 bytes, with the default settings:
    one 4 MiB segment per partition (version 1 took 640 MiB of 32 MiB rings)."""
    with Spool(tmp_path) as spool:
        for t in range(TOPICS):
            topic = f"topic-{t}"
            spool.set_partition_count(topic, PARTITIONS)
            for i in range(PARTITIONS * EVENTS_PER_PARTITION):
                spool.send(topic, b"v" * 100, key=b"key-%d" % i)
        depths = sorted(ref.ring.depth for ref in spool.queues())
        budget = spool.budget().used_bytes
    on_disk = sum(p.stat().st_blocks * 512 for p in tmp_path.rglob("*.queue"))
    assert len(depths) == TOPICS * PARTITIONS
    assert min(depths) > 0.8 * EVENTS_PER_PARTITION
    assert sum(depths) == TOPICS * PARTITIONS * EVENTS_PER_PARTITION
    assert on_disk == budget < 100 * MIB, f"{on_disk / MIB:.1f} MiB of queue files"
