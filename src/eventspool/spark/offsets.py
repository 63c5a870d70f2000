"""Offsets of the Kafka source: their JSON form, the read limit, the ranges Spark reads.

Pure logic, no I/O: everything here is decided from numbers the source fetched from the
broker, so it is tested exhaustively without one.

An offset, as Spark's own Kafka source writes it into the checkpoint, is the next offset to
read per topic and partition::

    {"orders": {"0": 1200, "1": 1187}, "payments": {"0": 310}}

Starting and ending offsets given as options use the same JSON with two sentinels:
-2 for the earliest offset of a partition and -1 for its latest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

EARLIEST = -2
LATEST = -1

OffsetJson = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one topic; ordered by topic, then partition number."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


PartitionOffsets = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records [from_offset, until_offset) of one partition: one Spark task reads them."""

    tp: TopicPartition
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


class OffsetSpecError(ValueError):
    """A startingOffsets / endingOffsets / assign option that cannot be understood."""


def to_json(offsets: Mapping[TopicPartition, int]) -> OffsetJson:
    """The checkpoint form: topics, then partition numbers as strings, sorted."""
    result: OffsetJson = {}
    for tp in sorted(offsets):
        result.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return result


def from_json(data: Mapping[str, Mapping[str, int]]) -> PartitionOffsets:
    """Read the checkpoint (or option) form back; rejects anything that is not topic ->
    partition -> integer."""
    result: PartitionOffsets = {}
    if not isinstance(data, Mapping):
        raise OffsetSpecError(f"offsets must be a JSON object of topics, got {data!r}")
    for topic, partitions in data.items():
        if not isinstance(partitions, Mapping):
            raise OffsetSpecError(
                f"offsets of topic {topic!r} must be an object of partition -> offset"
            )
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OffsetSpecError(
                    f"partition {partition!r} of topic {topic!r} is not a number"
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise OffsetSpecError(f"offset of {topic}-{partition} must be an integer")
            result[TopicPartition(topic, number)] = offset
    return result


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """What startingOffsets or endingOffsets asked for: a keyword or per-partition offsets."""

    kind: Literal["earliest", "latest", "specific"]
    specific: PartitionOffsets | None = None


def parse_offset_spec(text: str, option: str) -> OffsetSpec:
    """Parse "earliest", "latest" or the JSON form (with -2 / -1 sentinels)."""
    stripped = text.strip()
    if stripped.lower() in ("earliest", "latest"):
        return OffsetSpec("earliest" if stripped.lower() == "earliest" else "latest")
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise OffsetSpecError(
            f"{option} must be 'earliest', 'latest' or JSON like "
            f'{{"topic":{{"0":23,"1":-2}}}}, got {text!r} ({exc.msg})'
        ) from None
    offsets = from_json(data)
    for tp, offset in offsets.items():
        if offset < EARLIEST:
            raise OffsetSpecError(
                f"{option}: offset {offset} of {tp} is negative and neither -2 (earliest) "
                "nor -1 (latest)"
            )
    return OffsetSpec("specific", offsets)


def parse_assign(text: str) -> list[TopicPartition]:
    """Parse the assign option: {"topicA": [0, 1], "topicB": [2, 4]}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetSpecError(
            f'assign must be JSON like {{"topicA":[0,1]}}, got {text!r} ({exc.msg})'
        ) from None
    if not isinstance(data, dict) or not data:
        raise OffsetSpecError(f"assign must name at least one topic, got {text!r}")
    result: list[TopicPartition] = []
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OffsetSpecError(f"assign: partitions of {topic!r} must be a list of numbers")
        result.extend(TopicPartition(topic, p) for p in partitions)
    return sorted(set(result))


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """How the set of partitions moved between two looks at the broker's metadata."""

    added: frozenset[TopicPartition]
    removed: frozenset[TopicPartition]


def partition_change(
    known: Iterable[TopicPartition], current: Iterable[TopicPartition]
) -> PartitionChange:
    """Partitions that appeared (a topic grew, or a new topic matched the pattern) and
    partitions that disappeared (a topic was deleted)."""
    before = frozenset(known)
    now = frozenset(current)
    return PartitionChange(added=now - before, removed=before - now)


def rate_limit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_offsets: int,
) -> PartitionOffsets:
    """End offsets that advance at most `max_offsets` in total, shared by backlog size.

    Each partition gets the floor of its proportional share; the offsets left over go one
    by one to the partitions with the largest remainders (ties by topic and partition).
    Unlike Spark's rounding up of small shares, the total never exceeds the limit, and a
    limit of at least one always makes progress while there is a backlog. A partition
    missing from `start`, or whose latest is below its start, keeps its `latest`.
    """
    if max_offsets < 1:
        raise ValueError(f"the limit must be at least 1, got {max_offsets}")
    sizes = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(sizes.values())
    if total <= max_offsets:
        return dict(latest)
    shares = {tp: (size * max_offsets) // total for tp, size in sizes.items()}
    leftover = max_offsets - sum(shares.values())
    by_remainder = sorted(
        (tp for tp, size in sizes.items() if size > shares[tp]),
        key=lambda tp: (-((sizes[tp] * max_offsets) % total), tp),
    )
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    return {tp: start[tp] + shares[tp] if sizes[tp] > 0 else end for tp, end in latest.items()}


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut the ranges into at least `min_partitions` pieces (when there are that many
    records), bigger ranges into more pieces, so a small topic can use every core."""
    nonempty = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(nonempty) >= min_partitions:
        return nonempty
    total = sum(r.size for r in nonempty)
    result: list[OffsetRange] = []
    for r in nonempty:
        pieces = max(1, min(r.size, math.ceil(r.size * min_partitions / total)))
        step, extra = divmod(r.size, pieces)
        begin = r.from_offset
        for index in range(pieces):
            end = begin + step + (1 if index < extra else 0)
            result.append(OffsetRange(r.tp, begin, end))
            begin = end
    return result


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    earliest_of_new: Mapping[TopicPartition, int],
) -> tuple[list[OffsetRange], list[str]]:
    """The ranges between two offsets of a micro-batch, and what looks like lost data.

    A partition in `end` but not in `start` appeared during the query and is read from
    its earliest offset, as Spark's Kafka source does. A partition in `start` but not in
    `end` is gone, and an end below its start means the topic was recreated: both are
    reported for the caller to fail on or skip (failOnDataLoss).
    """
    ranges: list[OffsetRange] = []
    losses: list[str] = []
    for tp in sorted(end):
        begin = start[tp] if tp in start else earliest_of_new.get(tp, 0)
        until = end[tp]
        if until < begin:
            losses.append(
                f"{tp}: end offset {until} is below the start offset {begin}; "
                "the topic may have been deleted and recreated"
            )
            continue
        ranges.append(OffsetRange(tp, begin, until))
    losses.extend(
        f"{tp}: the partition is gone; the topic may have been deleted"
        for tp in sorted(set(start) - set(end))
    )
    return ranges, losses
