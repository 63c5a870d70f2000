"""The calls the poll thread makes on confluent_kafka's handles, as Protocols.

The logic above them (flow control, commits, forwarding, rebalances) takes any object
with these methods, so it is tested with a small stand-in, without a broker. The real
Consumer and Producer satisfy them by their own type stubs, which mypy checks where the
consumer makes them. `TopicPartition` and `Message` stay confluent_kafka's classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, overload

from confluent_kafka import Message, TopicPartition


class KafkaConsumerHandle(Protocol):
    """What the poll thread calls on a subscribed confluent_kafka Consumer."""

    def consume(self, num_messages: int, timeout: float, /) -> list[Message]: ...

    def assignment(self) -> list[TopicPartition]: ...

    def pause(self, partitions: list[TopicPartition], /) -> None: ...

    def resume(self, partitions: list[TopicPartition], /) -> None: ...

    # A blocking commit returns the committed partitions, an asynchronous one reports
    # them to the `on_commit` callback; either raises KafkaException when it cannot be sent.
    @overload
    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True]) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...

    def committed(
        self, partitions: list[TopicPartition], /, timeout: float
    ) -> list[TopicPartition]: ...

    def seek(self, partition: TopicPartition, /) -> None: ...

    def close(self) -> None: ...


# (error or None, message): confluent_kafka's delivery report.
DeliveryCallback = Callable[[Any, Any], None]


class ForwardProducer(Protocol):
    """What forwarding calls on a confluent_kafka Producer."""

    def produce(
        self,
        topic: str,
        /,
        *,
        value: bytes | None,
        key: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        timestamp: int,
        on_delivery: DeliveryCallback,
    ) -> None: ...

    def poll(self, timeout: float, /) -> int: ...

    def flush(self, timeout: float, /) -> int: ...
