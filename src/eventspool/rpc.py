"""Request/reply over Kafka: an `RpcClient` that waits for answers and a `Responder`
that turns a function into a consumer handler which answers.

A request is an ordinary event with three headers:

    correlation_id  the caller's id for this call (32 hex digits)
    reply_to        the topic the caller reads its replies from
    deadline_ms     wall-clock time (ms since the epoch) after which the caller has
                    given up; a responder skips requests it receives later

A reply goes to `reply_to` with the same `correlation_id`; a reply to a request whose
function raised also carries `rpc.error` (the exception's type name), and its value is
the exception's message. Delivery is at least once both ways, so a request can be
answered twice: the client keeps the first reply and ignores unknown correlation ids.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import KafkaConfigValue, validate_topic
from eventspool.consumer.handler import resolve_handler
from eventspool.consumer.record import Record
from eventspool.envelope import HeadersInput
from eventspool.errors import EventspoolError

log = logging.getLogger("eventspool.rpc")

CORRELATION_ID = "correlation_id"
REPLY_TO = "reply_to"
DEADLINE_MS = "deadline_ms"
ERROR = "rpc.error"
REPLY_TOPIC_PREFIX = "rpc.reply."
_POLL_S = 0.05
_SETUP_TIMEOUT_S = 15.0
_REPLY_FLUSH_S = 30.0
_SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")


class RpcError(EventspoolError):
    """A call could not be completed; base of the more specific RPC errors."""


class RpcTimeoutError(RpcError):
    """No reply arrived in time. The request may still be handled later; its reply is
    then dropped, so the call's side effects are unknown to the caller."""

    def __init__(self, topic: str, correlation_id: str, timeout: float) -> None:
        super().__init__(
            f"no reply to the request on topic {topic!r} within {timeout:g} s "
            f"(correlation_id {correlation_id}); it may still be handled later"
        )
        self.topic = topic
        self.correlation_id = correlation_id
        self.timeout = timeout


class RpcRemoteError(RpcError):
    """The responder's function raised; `error_type` and `remote_message` are its
    exception's type name and message."""

    def __init__(self, topic: str, correlation_id: str, error_type: str, message: str) -> None:
        super().__init__(
            f"the responder on topic {topic!r} raised {error_type}: {message} "
            f"(correlation_id {correlation_id})"
        )
        self.topic = topic
        self.correlation_id = correlation_id
        self.error_type = error_type
        self.remote_message = message


class Sender(Protocol):
    """What sends requests: `Spool`, the agent `Client`, or anything alike."""

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
    ) -> str: ...


@dataclass(slots=True)
class _Call:
    topic: str
    timeout: float
    future: Future[bytes]


@dataclass(slots=True)
class RpcClientCounters:
    """`unmatched` replies had no waiting call: duplicates, or answers after a timeout."""

    calls: int = 0
    replies: int = 0
    remote_errors: int = 0
    timeouts: int = 0
    unmatched: int = 0


class RpcClient:
    """Send requests through `sender` and wait for their replies on `reply_topic`.

    The reply topic is one per client by default (`rpc.reply.<uuid>`, one partition,
    created now and deleted by `close()`). The client reads it by assignment from its
    current end, not as a group member, so it reads from the first call on without a
    group join, and a rebalance among responders never stalls it. One thread matches
    replies to calls and fails calls whose timeout passed.
    """

    def __init__(
        self,
        sender: Sender,
        bootstrap_servers: str,
        *,
        reply_topic: str | None = None,
        kafka: Mapping[str, KafkaConfigValue] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._sender = sender
        self._clock = clock
        self._owns_topic = reply_topic is None
        self.reply_topic = reply_topic or f"{REPLY_TOPIC_PREFIX}{uuid.uuid4().hex}"
        validate_topic(self.reply_topic)
        self._security = {
            k: v for k, v in (kafka or {}).items() if k.startswith(_SECURITY_PREFIXES)
        }
        self._bootstrap = bootstrap_servers
        self._calls: dict[str, _Call] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._admin_client: Any = None
        self.counters = RpcClientCounters()
        if self._owns_topic:
            self._create_reply_topic()
        self._kafka: Any = KafkaConsumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"{self.reply_topic}.reader",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                **(kafka or {}),
            }
        )
        try:
            self._kafka.assign(self._end_of_reply_topic())
        except BaseException:
            self._kafka.close()
            raise
        self._thread = threading.Thread(target=self._read_replies, name="eventspool-rpc-replies")
        self._thread.daemon = True
        self._thread.start()

    # ----------------------------------------------------------------- calls

    def call(
        self, topic: str, value: bytes | None, key: bytes | str | None = None, timeout: float = 5.0
    ) -> bytes:
        """Send one request and return the reply's value.

        Raises RpcTimeoutError when no reply arrives within `timeout` seconds,
        RpcRemoteError when the responder's function raised, and what the sender raises
        when the request cannot be sent.
        """
        return self.call_async(topic, value, key, timeout).result()

    def call_async(
        self, topic: str, value: bytes | None, key: bytes | str | None = None, timeout: float = 5.0
    ) -> Future[bytes]:
        """Send one request; the future completes with the reply's value or an RpcError."""
        if timeout <= 0:
            raise ValueError(f"timeout={timeout}: must be positive")
        if self._closed.is_set():
            raise RpcError("the RPC client is closed")
        correlation_id = uuid.uuid4().hex
        future: Future[bytes] = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            self._calls[correlation_id] = _Call(topic, timeout, future)
            heapq.heappush(self._deadlines, (self._clock.monotonic() + timeout, correlation_id))
            self.counters.calls += 1
        headers = {
            CORRELATION_ID: correlation_id,
            REPLY_TO: self.reply_topic,
            DEADLINE_MS: str(self._clock.now_ms() + int(timeout * 1000)),
        }
        try:
            self._sender.send(topic, value, key=key, headers=headers)
        except BaseException:
            with self._lock:
                self._calls.pop(correlation_id, None)
            raise
        return future

    # ----------------------------------------------------------------- reply thread

    def _read_replies(self) -> None:
        try:
            while not self._closed.is_set():
                for message in self._kafka.consume(500, _POLL_S):
                    if message.error() is None:
                        self._match(message)
                    elif message.error().code() != KafkaError._PARTITION_EOF:
                        log.debug("reply topic %s: %s", self.reply_topic, message.error())
                self._expire()
        except Exception:
            log.exception("reply topic %s: the reply reader failed", self.reply_topic)
        finally:
            self._fail_all(RpcError("the RPC client is closed"))

    def _match(self, message: Any) -> None:
        headers = dict(message.headers() or ())
        raw_id = headers.get(CORRELATION_ID)
        correlation_id = raw_id.decode("ascii", "replace") if raw_id else ""
        with self._lock:
            call = self._calls.pop(correlation_id, None)
            if call is None:
                self.counters.unmatched += 1
                return
            self.counters.replies += 1
        error_type = headers.get(ERROR)
        if error_type is None:
            call.future.set_result(message.value() or b"")
            return
        self.counters.remote_errors += 1
        text = (message.value() or b"").decode("utf-8", "replace")
        call.future.set_exception(
            RpcRemoteError(call.topic, correlation_id, error_type.decode("utf-8", "replace"), text)
        )

    def _expire(self) -> None:
        now = self._clock.monotonic()
        expired: list[tuple[str, _Call]] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, correlation_id = heapq.heappop(self._deadlines)
                call = self._calls.pop(correlation_id, None)
                if call is not None:
                    expired.append((correlation_id, call))
            self.counters.timeouts += len(expired)
        for correlation_id, call in expired:
            call.future.set_exception(RpcTimeoutError(call.topic, correlation_id, call.timeout))

    def _fail_all(self, error: RpcError) -> None:
        with self._lock:
            calls = list(self._calls.values())
            self._calls.clear()
            self._deadlines.clear()
        for call in calls:
            call.future.set_exception(error)

    # ----------------------------------------------------------------- topic set-up

    def _admin(self) -> Any:
        """One admin client for the topic's creation and deletion: each must outlive its
        requests, or librdkafka cancels them (and logs about it)."""
        if self._admin_client is None:
            self._admin_client = AdminClient(
                {"bootstrap.servers": self._bootstrap, **self._security}
            )
        return self._admin_client

    def _create_reply_topic(self) -> None:
        topic = NewTopic(self.reply_topic, num_partitions=1, replication_factor=1)
        future = self._admin().create_topics([topic], request_timeout=_SETUP_TIMEOUT_S)
        try:
            future[self.reply_topic].result(_SETUP_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RpcError(f"cannot create reply topic {self.reply_topic!r}: {exc}") from exc
        except TimeoutError:
            raise RpcError(
                f"cannot create reply topic {self.reply_topic!r}: no answer to CreateTopics "
                f"from {self._bootstrap} in {_SETUP_TIMEOUT_S:.0f} s; create a topic and pass "
                "it as reply_topic"
            ) from None

    def _end_of_reply_topic(self) -> list[TopicPartition]:
        """Every partition at its current end, as explicit offsets: a symbolic 'end' is
        resolved only at the first fetch, and a reply written before that would be lost."""
        deadline = self._clock.monotonic() + _SETUP_TIMEOUT_S
        while True:
            try:
                metadata = self._kafka.list_topics(self.reply_topic, timeout=_SETUP_TIMEOUT_S)
                topic = metadata.topics[self.reply_topic]
                if topic.error is not None or not topic.partitions:
                    raise KafkaException(topic.error or "no partitions yet")
                return [
                    TopicPartition(
                        self.reply_topic,
                        partition,
                        self._kafka.get_watermark_offsets(
                            TopicPartition(self.reply_topic, partition), timeout=5.0
                        )[1],
                    )
                    for partition in sorted(topic.partitions)
                ]
            except KafkaException as exc:
                if self._clock.monotonic() > deadline:
                    raise RpcError(
                        f"cannot read the end of reply topic {self.reply_topic!r}: {exc}"
                    ) from exc
                self._closed.wait(0.1)

    # ----------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Fail calls still waiting with RpcError, stop reading replies and delete the
        reply topic this client created."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        self._kafka.close()
        if self._owns_topic:
            futures = self._admin().delete_topics([self.reply_topic], request_timeout=5.0)
            try:
                futures[self.reply_topic].result(5.0)
            except KafkaException as exc:
                log.warning("cannot delete reply topic %s: %s", self.reply_topic, exc)
        self._admin_client = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------- server side

Function = Callable[[Record], bytes | None]
# One reply producer per worker process and configuration, made on first use.
_producers: dict[tuple[str, tuple[tuple[str, KafkaConfigValue], ...]], Any] = {}


def _producer(bootstrap: str, kafka: tuple[tuple[str, KafkaConfigValue], ...]) -> Any:
    producer = _producers.get((bootstrap, kafka))
    if producer is None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                **dict(kafka),
            }
        )
        _producers[(bootstrap, kafka)] = producer
    return producer


class Responder:
    """A consumer handler that calls `function(record)` and sends what it returns to the
    request's `reply_to` topic, with its `correlation_id`.

    The reply is acknowledged by the broker before the handler returns, so a request is
    committed only once its reply is durable; if the reply cannot be written the handler
    raises and the consumer retries the request. An exception from `function` is sent
    back as an error reply (and not retried). Requests past their `deadline_ms` and
    events that are not requests are skipped.

    Picklable for worker processes: `function` travels by reference (`module:name`),
    so `@responder(...)` may decorate a module-level function under its own name.
    """

    def __init__(
        self,
        function: Function | str,
        bootstrap_servers: str,
        *,
        kafka: Mapping[str, KafkaConfigValue] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._target: Function | str = _reference(function)
        self._function: Function | None = None if isinstance(function, str) else function
        self._bootstrap = bootstrap_servers
        self._kafka = tuple(sorted((kafka or {}).items()))
        self._clock = clock
        if isinstance(function, str):
            resolve_handler(function)

    @property
    def function(self) -> Function:
        """The function itself, imported on first use in a worker process."""
        if self._function is None:
            assert isinstance(self._target, str)
            target: Any = resolve_handler(self._target)
            self._function = target.function if isinstance(target, Responder) else target
        assert self._function is not None
        return self._function

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if isinstance(self._target, str):
            state["_function"] = None
        return state

    def __call__(self, record: Record) -> None:
        raw_id = record.header(CORRELATION_ID)
        reply_to = record.header(REPLY_TO)
        if not raw_id or not reply_to:
            log.warning(
                "%s/%d@%d is not a request (no %s or %s header); skipped",
                record.topic,
                record.partition,
                record.offset,
                CORRELATION_ID,
                REPLY_TO,
            )
            return
        deadline = record.header(DEADLINE_MS)
        if deadline is not None and deadline.isdigit() and int(deadline) < self._clock.now_ms():
            log.info(
                "%s/%d@%d: the caller gave up %d ms ago; skipped",
                record.topic,
                record.partition,
                record.offset,
                self._clock.now_ms() - int(deadline),
            )
            return
        headers: list[tuple[str, bytes]] = [(CORRELATION_ID, raw_id)]
        try:
            value = self.function(record)
        except Exception as exc:
            headers.append((ERROR, type(exc).__qualname__.encode()))
            value = str(exc).encode("utf-8", "replace")
        self._reply(reply_to.decode("utf-8", "replace"), value, headers)

    def _reply(self, topic: str, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        producer = _producer(self._bootstrap, self._kafka)
        errors: list[Any] = []
        producer.produce(
            topic,
            value,
            headers=headers,
            on_delivery=lambda error, _message: errors.append(error),
        )
        if producer.flush(_REPLY_FLUSH_S) > 0 or not errors:
            raise RpcError(f"reply to {topic!r} not acknowledged within {_REPLY_FLUSH_S:g} s")
        if errors[0] is not None:
            raise RpcError(f"cannot write reply to {topic!r}: {errors[0]}")


def responder(
    bootstrap_servers: str,
    *,
    kafka: Mapping[str, KafkaConfigValue] | None = None,
) -> Callable[[Function], Responder]:
    """Decorate a module-level `function(record) -> bytes` into a Responder."""
    return functools.partial(_decorate, bootstrap_servers=bootstrap_servers, kafka=kafka)


def _decorate(
    function: Function, bootstrap_servers: str, kafka: Mapping[str, KafkaConfigValue] | None
) -> Responder:
    return Responder(function, bootstrap_servers, kafka=kafka)


def _reference(function: Function | str) -> Function | str:
    """A module-level function as `module:name`, so it pickles even once a decorator has
    bound its name to the Responder; anything else (a partial, a string) as it is."""
    if isinstance(function, str | functools.partial):
        return function
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", "")
    if module is None or "<" in name:
        raise ValueError(
            f"{function!r}: a responder's function must be a module-level function, "
            "'module:function' or a functools.partial of one, to reach worker processes"
        )
    return f"{module}:{name}"


__all__ = [
    "CORRELATION_ID",
    "DEADLINE_MS",
    "ERROR",
    "REPLY_TO",
    "Responder",
    "RpcClient",
    "RpcClientCounters",
    "RpcError",
    "RpcRemoteError",
    "RpcTimeoutError",
    "Sender",
    "responder",
]
