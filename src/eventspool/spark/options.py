"""The source's options, named and checked like Spark's own Kafka source.

Switching between ``format("kafka")`` and ``format("eventspool-kafka")`` is one line, so the
same option names mean the same things here; options we do not implement are refused by
name instead of being ignored silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from eventspool.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OffsetSpecError,
    TopicPartition,
    parse_assign,
    parse_offset_spec,
)

# Kafka consumer settings the source owns itself; Spark refuses the same ones.
_REFUSED_KAFKA = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint and are never committed",
    "key.deserializer": "keys are always returned as bytes",
    "value.deserializer": "values are always returned as bytes",
    "interceptor.classes": "interceptors do not exist in librdkafka",
}
# Options of Spark's Kafka source this source does not implement.
_UNSUPPORTED = (
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupIdPrefix",
)


class SourceOptionError(ValueError):
    """An option is missing, malformed, contradicts another or is not supported."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: named topics, a topic pattern, or fixed partitions."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether a topic on the broker belongs to the subscription (assign: by name)."""
        if self.pattern is not None:
            return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None
        if self.assign:
            return any(tp.topic == topic for tp in self.assign)
        return topic in self.topics


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every option the source understands, parsed once on the driver."""

    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    initial_offsets_location: str | None = None
    arrow: bool = True
    kafka: dict[str, str] = field(default_factory=dict)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise SourceOptionError(f"{name} must be true or false, got {raw!r}")
    return value == "true"


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SourceOptionError(f"{name} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise SourceOptionError(f"{name} must be a positive integer, got {raw!r}")
    return value


def _timestamp(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SourceOptionError(
            f"{name} must be milliseconds since the epoch, got {raw!r}"
        ) from None
    if value < 0:
        raise SourceOptionError(f"{name} must not be negative, got {raw!r}")
    return value


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [
        name for name in ("assign", "subscribe", "subscribePattern") if name.lower() in options
    ]
    if len(given) != 1:
        raise SourceOptionError(
            "exactly one of 'assign', 'subscribe' and 'subscribePattern' must be set, got "
            f"{given or 'none'}"
        )
    value = str(options[given[0].lower()])
    if given[0] == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise SourceOptionError(f"subscribe names no topic: {value!r}")
        return Subscription(topics=topics)
    if given[0] == "subscribePattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise SourceOptionError(f"subscribePattern {value!r} is not a pattern: {exc}") from None
        return Subscription(pattern=value)
    try:
        return Subscription(assign=tuple(parse_assign(value)))
    except OffsetSpecError as exc:
        raise SourceOptionError(str(exc)) from None


def _offsets(options: Mapping[str, str], name: str, default: str) -> OffsetSpec:
    try:
        return parse_offset_spec(str(options.get(name.lower(), default)), name)
    except OffsetSpecError as exc:
        raise SourceOptionError(str(exc)) from None


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check and parse the options for a streaming or a batch read.

    As in Spark: a stream starts at "latest" unless told otherwise and may not set
    endingOffsets; a batch read goes from "earliest" to "latest" and may not start at
    "latest" or end at "earliest".
    """
    keys = {str(k).lower(): v for k, v in options.items()}
    for name in _UNSUPPORTED:
        if name.lower() in keys:
            raise SourceOptionError(f"option {name!r} is not supported by this source")
    bootstrap = keys.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise SourceOptionError("option 'kafka.bootstrap.servers' must be set")
    kafka: dict[str, str] = {}
    for key, value in keys.items():
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            name = key[len("kafka.") :]
            if name in _REFUSED_KAFKA:
                raise SourceOptionError(
                    f"Kafka option {name!r} is not supported: {_REFUSED_KAFKA[name]}"
                )
            kafka[name] = str(value)
    subscription = _subscription(keys)
    starting = _offsets(keys, "startingOffsets", "latest" if streaming else "earliest")
    if streaming and "endingoffsets" in keys:
        raise SourceOptionError("endingOffsets is for batch reads only")
    if streaming and "endingtimestamp" in keys:
        raise SourceOptionError("endingTimestamp is for batch reads only")
    ending = _offsets(keys, "endingOffsets", "latest")
    if not streaming:
        if starting.kind == "latest":
            raise SourceOptionError("startingOffsets 'latest' is not valid for a batch read")
        if starting.specific and any(o == LATEST for o in starting.specific.values()):
            raise SourceOptionError("startingOffsets of a batch read may not use -1 (latest)")
        if ending.kind == "earliest":
            raise SourceOptionError("endingOffsets 'earliest' is not valid for a batch read")
        if ending.specific and any(o == EARLIEST for o in ending.specific.values()):
            raise SourceOptionError("endingOffsets may not use -2 (earliest)")
    if "maxoffsetspertrigger" in keys and not streaming:
        raise SourceOptionError("maxOffsetsPerTrigger is for streaming reads only")
    strategy = str(keys.get("startingoffsetsbytimestampstrategy", "error")).lower()
    if strategy not in ("error", "latest"):
        raise SourceOptionError(
            f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', got {strategy!r}"
        )
    poll_timeout = _positive_int(keys, "kafkaConsumer.pollTimeoutMs")
    return SourceOptions(
        bootstrap_servers=str(bootstrap),
        subscription=subscription,
        starting=starting,
        ending=ending,
        starting_timestamp=_timestamp(keys, "startingTimestamp"),
        ending_timestamp=_timestamp(keys, "endingTimestamp"),
        timestamp_strategy=strategy,
        max_offsets_per_trigger=_positive_int(keys, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(keys, "minPartitions"),
        include_headers=_bool(keys, "includeHeaders", False),
        fail_on_data_loss=_bool(keys, "failOnDataLoss", True),
        poll_timeout_ms=poll_timeout if poll_timeout is not None else 120_000,
        initial_offsets_location=(
            str(keys["initialoffsetslocation"]) if "initialoffsetslocation" in keys else None
        ),
        arrow=_bool(keys, "arrow", True),
        kafka=kafka,
    )
