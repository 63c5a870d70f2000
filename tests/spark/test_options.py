"""Options are named, defaulted and refused like Spark's own Kafka source's."""

from __future__ import annotations

import pytest

from eventspool.spark.offsets import TopicPartition
from eventspool.spark.options import SourceOptionError, parse_options

BASE = {"kafka.bootstrap.servers": "h:1", "subscribe": "a, b"}


def test_defaults_follow_spark() -> None:
    stream = parse_options(BASE, streaming=True)
    batch = parse_options(BASE, streaming=False)
    assert stream.subscription.topics == ("a", "b")
    assert stream.starting.kind == "latest"
    assert batch.starting.kind == "earliest"
    assert batch.ending.kind == "latest"
    assert stream.fail_on_data_loss is True
    assert stream.include_headers is False
    assert stream.max_offsets_per_trigger is None


def test_keys_are_case_insensitive_and_kafka_settings_pass_through() -> None:
    options = parse_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "SubscribePattern": "orders-.*",
            "maxOffsetsPerTrigger": "100",
            "includeHeaders": "TRUE",
            "kafka.security.protocol": "SSL",
            "kafka.group.id": "mine",
        },
        streaming=True,
    )
    assert options.subscription.pattern == "orders-.*"
    assert options.subscription.matches("orders-eu")
    assert not options.subscription.matches("orders")
    assert not options.subscription.matches("__consumer_offsets")
    assert options.max_offsets_per_trigger == 100
    assert options.include_headers is True
    assert options.kafka == {"security.protocol": "SSL", "group.id": "mine"}


def test_assign() -> None:
    options = parse_options(
        {"kafka.bootstrap.servers": "h:1", "assign": '{"t":[1,0]}'}, streaming=False
    )
    assert options.subscription.assign == (TopicPartition("t", 0), TopicPartition("t", 1))
    assert options.subscription.matches("t")


@pytest.mark.parametrize(
    ("extra", "streaming", "message"),
    [
        ({"subscribePattern": "x"}, True, "exactly one of"),
        ({"kafka.auto.offset.reset": "earliest"}, True, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, True, "never committed"),
        ({"endingOffsets": "latest"}, True, "batch reads only"),
        ({"startingOffsets": "latest"}, False, "not valid for a batch"),
        ({"startingOffsets": '{"a":{"0":-1}}'}, False, "-1"),
        ({"endingOffsets": "earliest"}, False, "not valid for a batch"),
        ({"endingOffsets": '{"a":{"0":-2}}'}, False, "-2"),
        ({"maxOffsetsPerTrigger": "0"}, True, "positive integer"),
        ({"maxOffsetsPerTrigger": "10"}, False, "streaming reads only"),
        ({"includeHeaders": "yes"}, True, "true or false"),
        ({"minOffsetsPerTrigger": "10"}, True, "not supported"),
        ({"startingTimestamp": "soon"}, True, "milliseconds"),
        ({"startingOffsetsByTimestampStrategy": "closest"}, True, "'error' or 'latest'"),
    ],
)
def test_refused(extra: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options({**BASE, **extra}, streaming=streaming)


def test_bootstrap_servers_are_required() -> None:
    with pytest.raises(SourceOptionError, match=r"kafka\.bootstrap\.servers"):
        parse_options({"subscribe": "a"}, streaming=True)
