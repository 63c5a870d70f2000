"""Small stand-ins for confluent_kafka's handles, satisfying the consumer's Protocols, so
flow control, commits and forwarding are tested without a broker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, overload

from confluent_kafka import KafkaException, Message, TopicPartition


@dataclass
class FakeConsumer:
    """Records pauses, resumes, commits and seeks; `commit_error` makes commit() raise."""

    assigned: list[TopicPartition] = field(default_factory=list)
    paused: list[list[TopicPartition]] = field(default_factory=list)
    resumed: list[list[TopicPartition]] = field(default_factory=list)
    commits: list[tuple[list[TopicPartition], bool]] = field(default_factory=list)
    seeks: list[TopicPartition] = field(default_factory=list)
    commit_error: KafkaException | None = None

    def consume(self, num_messages: int, timeout: float, /) -> list[Message]:
        return []

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def pause(self, partitions: list[TopicPartition], /) -> None:
        self.paused.append(partitions)

    def resume(self, partitions: list[TopicPartition], /) -> None:
        self.resumed.append(partitions)

    @overload
    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True]) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool
    ) -> list[TopicPartition] | None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append((offsets, asynchronous))
        return None if asynchronous else offsets

    def committed(
        self, partitions: list[TopicPartition], /, timeout: float
    ) -> list[TopicPartition]:
        return partitions

    def seek(self, partition: TopicPartition, /) -> None:
        self.seeks.append(partition)

    def close(self) -> None:
        pass


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]]
    timestamp: int
    on_delivery: Any


@dataclass
class FakeProducer:
    """Keeps what was produced; a test answers each write through its `on_delivery`."""

    config: dict[str, Any]
    produced: list[Produced] = field(default_factory=list)
    flushed: list[float] = field(default_factory=list)

    def produce(
        self,
        topic: str,
        /,
        *,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        timestamp: int,
        on_delivery: Any,
    ) -> None:
        self.produced.append(Produced(topic, value, key, headers, timestamp, on_delivery))

    def poll(self, timeout: float, /) -> int:
        return 0

    def flush(self, timeout: float, /) -> int:
        self.flushed.append(timeout)
        return 0
