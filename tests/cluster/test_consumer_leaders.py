"""The Consumer on a 3-broker cluster while partition leaders move and a broker goes down
with its leaders re-elected: it stays in its group, handles every event and ends
committed to the end."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path

import pytest

from eventspool.broker.mock import MockCluster
from tests.cluster.test_consumer_cluster import (
    OUTLIVES_OUTAGE,
    PARTITIONS,
    _all_handled,
    _committed_to_the_end,
    _consumer,
    _fill,
    _topic,
)
from tests.consumer.conftest import handled, wait_for
from tests.consumer.handlers import slow_record_to

pytestmark = [pytest.mark.slow, pytest.mark.fault]

EVENTS = 6_000


def test_leader_moves_and_a_broker_down_leave_nothing_unhandled_or_uncommitted(
    cluster: MockCluster, tmp_path: Path
) -> None:
    topic = _topic(cluster)
    group = f"leaders-{uuid.uuid4().hex[:8]}"
    cluster.set_coordinator(group, 1)
    ids = _fill(cluster, topic, keyed=True, count=EVENTS)
    out = tmp_path / "handled"
    # 1 ms per event: the faults land while most events are still to come.
    consumer = _consumer(
        cluster, topic, group, functools.partial(slow_record_to, out, 0.001), OUTLIVES_OUTAGE
    )
    consumer.start()
    try:
        wait_for(lambda: len(handled(out)) >= EVENTS // 6, 60, "a first share handled")
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
        wait_for(lambda: len(handled(out)) >= EVENTS // 3, 60, "events after the move")
        cluster.broker_down(3)  # its partitions get new leaders, as a controller would
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, partition % 2 + 1)
        wait_for(lambda: len(handled(out)) >= EVENTS // 2, 60, "events with broker 3 down")
        cluster.broker_up(3)
        wait_for(_all_handled(out, ids), 90, "every event handled")
        assert consumer.status().counters.rebalances == 1, "the member left its group"
    finally:
        final = consumer.stop()
    assert final.uncommitted == ()
    assert _committed_to_the_end(cluster, group, topic)()
