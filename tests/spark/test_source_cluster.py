"""The Spark source on a 3-broker cluster (librdkafka's mock): leaders move and a broker
goes down while a streaming query runs; the query never fails and reads exactly the ids
that were sent. The mock may append a retried batch twice, so the ids are compared as sets.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from pyspark.sql import SparkSession

from eventspool.broker.mock import MockCluster
from eventspool.spark.source import FORMAT
from tests.spark.conftest import SPARK_MARKS, produce, wait_for

pytestmark = SPARK_MARKS

PARTITIONS = 6


def test_a_streaming_query_reads_through_leader_moves_and_a_broker_down(
    spark: SparkSession, cluster: MockCluster, tmp_path: Path
) -> None:
    topic = f"moving-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    bootstrap = cluster.bootstrap_servers
    sent: set[bytes] = set()

    def send(count: int) -> None:
        values = [uuid.uuid4().hex.encode() for _ in range(count)]
        produce(bootstrap, topic, [(i % PARTITIONS, None, v) for i, v in enumerate(values)])
        sent.update(values)

    send(600)
    name = f"t_{uuid.uuid4().hex[:10]}"
    query = (
        spark.readStream.format(FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.socket.connection.setup.timeout.ms", "3000")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(processingTime="500 milliseconds")
        .start()
    )

    def values() -> set[bytes]:
        return {bytes(row.value) for row in spark.table(name).select("value").collect()}

    try:
        wait_for(query, lambda: len(values()) >= 600)
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
        send(600)
        cluster.broker_down(3)  # its partitions get new leaders, as a controller would
        for partition in range(PARTITIONS):
            cluster.set_leader(topic, partition, partition % 2 + 1)
        send(600)
        time.sleep(3)
        cluster.broker_up(3)
        send(600)
        wait_for(query, lambda: values() >= sent)
        assert query.exception() is None
        assert query.isActive
        assert values() == sent
    finally:
        query.stop()
