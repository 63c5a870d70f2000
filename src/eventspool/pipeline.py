"""The in-process entry point: `Spool.send()` returns once the event is on local disk.

`Spool` assembles the layers below it: storage (`spool/`), the sender, routing and
metrics. It lives above them so that none of them imports it (make lint's contracts).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from eventspool._core.native import SpoolFront
from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import SenderSettings, SpoolSettings, validate_topic
from eventspool.envelope import (
    EventIdGenerator,
    HeadersInput,
    caller_event_id,
    encode,
    normalize_headers,
)
from eventspool.errors import EventTooLargeError, InvalidEventError, SpoolClosedError
from eventspool.metrics import FSYNC_SECONDS
from eventspool.routing.exchanges import Exchange, routing_key_bytes, validate_routing_key
from eventspool.routing.table import ExchangeCounts, ExchangeInfo, ExchangeTable
from eventspool.sender.sender import Sender
from eventspool.spool.budget import BudgetUse
from eventspool.spool.lock import OwnerLock
from eventspool.spool.registry import QueueRef, QueueRegistry, TopicQueues
from eventspool.spool.ring import RecoveryReport
from eventspool.spool.segments import SegmentedQueue
from eventspool.wire.checks import bad_value, one_target, text_key

log = logging.getLogger(__name__)

_FLUSH_POLL_S = 0.005


class Spool(SpoolFront):
    """A durable local queue of events for Kafka, owned by this process.

    `send()` writes the event to the ring file of its (topic, partition) and returns its
    event_id; from then on the event survives the death of this process. One process
    owns a spool directory at a time; a second gets SpoolLockedError.

    `send()` itself is SpoolFront.send, compiled: it writes the common event (no headers,
    no exchange, a topic already open) without a Python frame, and hands everything else
    to `_send_python`, which checks every argument and applies every policy.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        bootstrap_servers: str | None = None,
        *,
        settings: SpoolSettings | None = None,
        sender_settings: SenderSettings | None = None,
        exchanges: Iterable[Exchange] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.directory = Path(directory)
        self.bootstrap_servers = bootstrap_servers
        self.settings = settings or SpoolSettings()
        self._clock = clock
        self.directory.mkdir(parents=True, exist_ok=True)
        self._owner = OwnerLock(self.directory)
        self._ids = EventIdGenerator(clock)
        try:
            self._exchanges = ExchangeTable(self.directory, exchanges)
            self._registry = QueueRegistry(
                self.directory, self.settings, clock, self._ids, FSYNC_SECONDS.observe
            )
        except BaseException:
            self._owner.release()
            raise
        self._topics: dict[str | None, TopicQueues] = {}
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

    def _send_python(  # noqa: PLR0917  # send()'s own parameters, in its order
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None,
        headers: HeadersInput | None,
        exchange: str | None,
        routing_key: str,
        event_id: str | uuid.UUID | None,
    ) -> str:
        """`send()` for every event its compiled front does not write itself.

        With `exchange` (and `topic=None`) the event is routed by `routing_key` instead:
        see `_publish`.
        """
        own_id = None if event_id is None else caller_event_id(event_id)
        if exchange is not None:
            one_target(topic, exchange)
            return self._publish(exchange, routing_key, value, key, headers, own_id)
        try:
            queues = self._topics[topic]
        except (KeyError, TypeError):
            queues = self._open_topic(topic)
        if value is not None and type(value) is not bytes:
            raise bad_value(value, "topic", topic)
        if key is not None and type(key) is not bytes:
            key = text_key(key, "topic", topic)
        if headers is None and own_id is None:
            spooled_id = queues.route.send(key, value)
            if spooled_id is not None:
                return spooled_id
        return self._send_slow(queues, key, value, headers, own_id)

    def _send_slow(
        self,
        queues: TopicQueues,
        key: bytes | None,
        value: bytes | None,
        headers: HeadersInput | None,
        own_id: str | None,
    ) -> str:
        """Everything the compiled send leaves to Python: headers, policies and errors.

        A pending topic, a ring not opened yet, a full, busy, closed or fsync ring, an
        event over the limit and an event with the caller's own id all come here, where
        the ring's policy applies.
        """
        header_list = None if headers is None else normalize_headers(headers)
        now = self._clock.now_ms()
        event_id = own_id or self._ids.next_id(now)
        payload = encode(event_id.encode(), now, key, value, header_list)
        if len(payload) > self.settings.max_event_bytes:
            raise EventTooLargeError(
                f"event for topic {queues.name!r} is {len(payload)} bytes, over the maximum of "
                f"{self.settings.max_event_bytes} (max_event_bytes)"
            )
        queues.append(key, payload, now)
        return event_id

    def _publish(  # noqa: PLR0917  # send()'s own parameters, in its order
        self,
        exchange: str,
        routing_key: str,
        value: bytes | None,
        key: bytes | str | None,
        headers: HeadersInput | None,
        own_id: str | None,
    ) -> str:
        """Route one event through `exchange` and write it once to each target topic.

        All or nothing: the event, with one event_id, is written to every target topic or,
        when any of them cannot take it (full under `reject`, closed, too large), to none,
        and the error is raised. Headers `exchange` and `routing_key` are added after the
        caller's, so consumers see how the event was routed; the Kafka key stays `key`.
        Raises UnknownExchangeError, and UnroutableError when nothing matches and the
        exchange has no alternate topic.
        """
        if self._closed:
            raise SpoolClosedError(f"spool {self.directory} is closed")
        if type(exchange) is not str:
            raise InvalidEventError(f"exchange must be a str, got {type(exchange).__name__}")
        if type(routing_key) is not str:
            validate_routing_key(routing_key)
        raw_routing_key = routing_key_bytes(routing_key)
        if value is not None and type(value) is not bytes:
            raise bad_value(value, "exchange", exchange)
        if key is not None and type(key) is not bytes:
            key = text_key(key, "exchange", exchange)
        route = self._exchanges.route(exchange, routing_key)
        header_list = normalize_headers(headers) or []
        header_list.append(("exchange", exchange.encode()))
        header_list.append(("routing_key", raw_routing_key))
        now = self._clock.now_ms()
        event_id = own_id or self._ids.next_id(now)
        payload = encode(event_id.encode(), now, key, value, header_list)
        if len(payload) > self.settings.max_event_bytes:
            raise EventTooLargeError(
                f"event for exchange {exchange!r} is {len(payload)} bytes, over the maximum "
                f"of {self.settings.max_event_bytes} (max_event_bytes)"
            )
        targets = [self._topics.get(name) or self._open_topic(name) for name in route.topics]
        if len(targets) == 1:
            targets[0].append(key, payload, now)
        else:
            self._registry.append_to_each(targets, key, payload, now)
        self._exchanges.written(exchange, route)
        return event_id

    def _open_topic(self, topic: str | None) -> TopicQueues:
        if self._closed:
            raise SpoolClosedError(f"spool {self.directory} is closed")
        name = validate_topic(topic)
        queues = self._registry.topic(name)
        self._topics[name] = queues
        self._routes[name] = queues.route
        return queues

    # ---- exchanges -------------------------------------------------------------------

    def declare_exchange(self, exchange: Exchange) -> bool:
        """Create or replace an exchange at runtime; True when it is new.

        The declaration is saved in the spool directory before it takes effect, so it
        survives a restart. Raises ExchangeConflictError for an exchange declared in the
        constructor's `exchanges` (the configuration), QueueFileError if it cannot be saved.
        """
        return self._exchanges.declare(exchange)

    def delete_exchange(self, name: str) -> None:
        """Remove a runtime exchange, durably.

        Raises UnknownExchangeError, or ExchangeConflictError for a configured exchange.
        """
        self._exchanges.delete(name)

    def exchange(self, name: str) -> ExchangeInfo:
        """One exchange with its source and counters; raises UnknownExchangeError."""
        return self._exchanges.info(name)

    def exchanges(self) -> list[ExchangeInfo]:
        """Every exchange, configured and runtime, by name, with its counters."""
        return self._exchanges.infos()

    def exchange_counts(self) -> dict[str, ExchangeCounts]:
        """Counters of every exchange that saw an event since opening, deleted ones included."""
        return self._exchanges.all_counts()

    def set_partition_count(self, topic: str, count: int) -> None:
        """Tell the spool how many partitions `topic` has (the sender learns it from Kafka)."""
        self._registry.set_partition_count(validate_topic(topic), count)

    def queues(self) -> list[QueueRef]:
        return list(self._registry.refs())

    def budget(self) -> BudgetUse:
        """The disk budget's use: queue-file bytes and topics against their limits."""
        return self._registry.budget.use()

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
        moves = self.sender.moves
        while True:
            if self.sender.moves != moves or not all(ring.is_open for ring, _ in targets):
                # Events moved to other rings (a pending ring into partitions, keyless
                # events off a partition without a leader): wait for their new ends.
                moves = self.sender.moves
                targets = self._flush_targets()
            remaining = sum(max(0, target - ring.head_seq) for ring, target in targets)
            if not remaining or (deadline is not None and self._clock.monotonic() >= deadline):
                return remaining
            time.sleep(_FLUSH_POLL_S)

    def _flush_targets(self) -> list[tuple[SegmentedQueue, int]]:
        return [(ref.ring, ref.ring.next_seq) for ref in self._registry.refs()]

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting events, wait up to `timeout` for in-flight acknowledgements, persist.

        Events not acknowledged by then stay in the spool and are sent after reopening.
        With the brokers unreachable (the last metadata request went unanswered) there is
        nothing to wait for, so close() does not.
        """
        if self._closed:
            return
        self._closed = True
        self._topics.clear()
        self._routes.clear()
        try:
            if self.sender is not None:
                left = self.unacknowledged() if self.sender.unreachable else self.flush(timeout)
                if left:
                    log.info(
                        "closing with %d events not acknowledged by Kafka%s: they stay in %s "
                        "and are sent once a spool with a sender opens it again",
                        left,
                        " (the brokers are unreachable)" if self.sender.unreachable else "",
                        self.directory,
                    )
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
