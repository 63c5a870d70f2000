"""The in-process entry point: `Spool.send()` returns once the event is on local disk."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import SenderSettings, SpoolSettings, validate_topic
from eventspool.envelope import EventIdGenerator, HeadersInput, encode, normalize_headers
from eventspool.errors import EventTooLargeError, InvalidEventError, SpoolClosedError
from eventspool.sender.sender import Sender
from eventspool.spool.lock import OwnerLock
from eventspool.spool.registry import QueueRef, QueueRegistry, TopicQueues
from eventspool.spool.ring import RecoveryReport, RingQueue

_FLUSH_POLL_S = 0.005


def _encode_text(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidEventError(f"{what} is not encodable as UTF-8: {exc.reason}") from None


class Spool:
    """A durable local queue of events for Kafka, owned by this process.

    `send()` writes the event to the ring file of its (topic, partition) and returns its
    event_id; from then on the event survives the death of this process. One process
    owns a spool directory at a time; a second gets SpoolLockedError.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        bootstrap_servers: str | None = None,
        *,
        settings: SpoolSettings | None = None,
        sender_settings: SenderSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.directory = Path(directory)
        self.bootstrap_servers = bootstrap_servers
        self.settings = settings or SpoolSettings()
        self._clock = clock
        self.directory.mkdir(parents=True, exist_ok=True)
        self._owner = OwnerLock(self.directory)
        try:
            self._registry = QueueRegistry(self.directory, self.settings, clock)
        except BaseException:
            self._owner.release()
            raise
        self._ids = EventIdGenerator(clock)
        self._topics: dict[str, TopicQueues] = {}
        self._closed = False
        self.sender: Sender | None = None
        if bootstrap_servers:
            self.sender = Sender(
                self._registry,
                bootstrap_servers,
                sender_settings or SenderSettings(),
                self.directory,
                clock,
            )
            self.sender.start()

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
    ) -> str:
        """Spool one event and return its event_id once it is durable.

        `value=None` is a tombstone (delete marker for compacted topics), distinct from
        `b""`. Raises InvalidEventError for a bad topic, value, key or header, or an event
        over `max_event_bytes`; SpoolFullError when the queue is full under `reject`
        (or `block` timed out).
        """
        try:
            queues = self._topics[topic]
        except (KeyError, TypeError):
            queues = self._open_topic(topic)
        if value is not None and type(value) is not bytes:
            raise InvalidEventError(
                f"value for topic {topic!r} must be bytes or None, got {type(value).__name__}"
                + (": encode it first, e.g. value.encode()" if isinstance(value, str) else "")
            )
        if key is not None and type(key) is not bytes:
            if not isinstance(key, str):
                raise InvalidEventError(
                    f"key for topic {topic!r} must be bytes, str or None, got {type(key).__name__}"
                )
            key = _encode_text(key, f"key for topic {topic!r}")
        header_list = None if headers is None else normalize_headers(headers)
        now = self._clock.now_ms()
        event_id = self._ids.next_id(now)
        payload = encode(event_id.encode(), now, key, value, header_list)
        if len(payload) > self.settings.max_event_bytes:
            raise EventTooLargeError(
                f"event for topic {topic!r} is {len(payload)} bytes, over the maximum of "
                f"{self.settings.max_event_bytes} (max_event_bytes)"
            )
        queues.append(key, payload, now)
        return event_id

    def _open_topic(self, topic: str) -> TopicQueues:
        if self._closed:
            raise SpoolClosedError(f"spool {self.directory} is closed")
        queues = self._registry.topic(validate_topic(topic))
        self._topics[topic] = queues
        return queues

    def set_partition_count(self, topic: str, count: int) -> None:
        """Tell the spool how many partitions `topic` has (the sender learns it from Kafka)."""
        self._registry.set_partition_count(validate_topic(topic), count)

    def queues(self) -> list[QueueRef]:
        return list(self._registry.refs())

    def recovery_reports(self) -> dict[str, RecoveryReport]:
        """What opening each ring found, by file name, for rings that skipped anything."""
        return {
            str(ref.ring.path): ref.ring.recovery
            for ref in self._registry.refs()
            if ref.ring.recovery.corrupt_tail
        }

    def unacknowledged(self) -> int:
        """Events spooled and not yet acknowledged by Kafka (pending ones included)."""
        return sum(ref.ring.depth for ref in self._registry.refs())

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every event sent so far is acknowledged by the broker.

        Returns how many of them are still unacknowledged when the wait ends: 0 on
        success, like confluent_kafka.Producer.flush(). Without a sender (no bootstrap
        servers) nothing is ever acknowledged, so it returns at once.
        """
        targets = self._flush_targets()
        if self.sender is None:
            return sum(target - ring.head_seq for ring, target in targets)
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        while True:
            if not all(ring.is_open for ring, _ in targets):
                # A pending ring was moved into partitions: wait for their new ends.
                targets = self._flush_targets()
            remaining = sum(max(0, target - ring.head_seq) for ring, target in targets)
            if not remaining or (deadline is not None and self._clock.monotonic() >= deadline):
                return remaining
            time.sleep(_FLUSH_POLL_S)

    def _flush_targets(self) -> list[tuple[RingQueue, int]]:
        return [(ref.ring, ref.ring.next_seq) for ref in self._registry.refs()]

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting events, wait up to `timeout` for in-flight acknowledgements, persist.

        Events not acknowledged by then stay in the spool and are sent after reopening.
        """
        if self._closed:
            return
        self._closed = True
        self._topics.clear()
        try:
            if self.sender is not None:
                self.flush(timeout)
                self.sender.stop()
        finally:
            self._registry.close()
            self._owner.release()

    def __enter__(self) -> Spool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
