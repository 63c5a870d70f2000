"""Log records as events: `SpoolHandler` (in-process spool) and `AgentHandler` (local agent).

Each record becomes one event whose value is what the handler's formatter returns,
encoded as UTF-8; by default `JsonFormatter`, one JSON object per record. With
`key_attribute`, the record attribute of that name (given with ``extra=``, such as a
request id) is the event's key, so the records of one key keep their order in Kafka.

A logging handler must never break the application it serves, so neither handler
raises from `emit()`: what goes wrong is counted on the handler and reported through
`logging.Handler.handleError` at most once per `error_interval_s`, with the counts of
what happened since the last report. `SpoolHandler` blocks a caller no longer than
`Spool.send()` does (the topic's full policy decides); `AgentHandler` does not block
it at all: records wait in a bounded buffer while a thread of the handler ships them,
and are retried while the agent is away.

Neither ships the records of eventspool's own loggers (`eventspool.*`), which would
otherwise come back through the spool they are about.

Both are built from keyword arguments only, so `logging.config.dictConfig` can
configure them (see the README); a bad setting raises ValueError naming it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from eventspool.client.sync import AgentError, Client
from eventspool.clock import SYSTEM_CLOCK, Clock
from eventspool.config import validate_topic
from eventspool.errors import EventspoolError, InvalidTopicError, SpoolClosedError, SpoolFullError
from eventspool.pipeline import Spool
from eventspool.wire.checks import event_payload

__all__ = ["AgentHandler", "JsonFormatter", "LogDeliveryError", "SpoolHandler"]

# What every LogRecord carries by itself; anything else on a record came with `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}
DEFAULT_ERROR_INTERVAL_S = 60.0
# Refusals by the agent that may go away by themselves: the event is sent again.
_RETRYABLE = (AgentError, SpoolFullError, SpoolClosedError)
_FIRST_RETRY_PAUSE_S = 0.05
_MAX_RETRY_PAUSE_S = 1.0


class LogDeliveryError(EventspoolError):
    """What a handler reports through `handleError`: records it could not deliver (yet)."""


class JsonFormatter(logging.Formatter):
    """One record as one JSON object, the fields a log consumer needs to search by.

    ``time`` (ISO 8601, UTC, microseconds), ``level``, ``logger``, ``message``,
    ``process``, ``thread`` and ``thread_name`` always; ``exception`` (``type``,
    ``message``, ``traceback``) and ``stack`` when the record has them; ``extra`` with
    every attribute given through ``extra=``. Values JSON cannot hold are written as
    their `str()`. Override `fields()` to change what is written.
    """

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """The JSON object of one record, before it is serialised."""
        fields: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.thread,
            "thread_name": record.threadName,
        }
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            # Cached on the record, as logging.Formatter does, for the record's other handlers.
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
            fields["exception"] = {
                "type": type(error).__qualname__,
                "message": str(error),
                "traceback": record.exc_text,
            }
        elif record.exc_text:  # rendered before it got here, the exception object gone
            fields["exception"] = {"traceback": record.exc_text}
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        extra = {
            name: value
            for name, value in vars(record).items()
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_")
        }
        if extra:
            fields["extra"] = extra
        return fields

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record), default=str, ensure_ascii=False)


def _not_eventspools_own(record: logging.LogRecord) -> bool:
    """eventspool's own log records are not shipped: a spool that cannot reach Kafka would
    queue its complaints about that into itself, and librdkafka's lines with them."""
    return not (record.name == "eventspool" or record.name.startswith("eventspool."))


class _Reports:
    """Lets one failure report through per interval, so a full spool or a dead agent
    cannot flood stderr with a traceback per record, nor slow the application with them."""

    def __init__(self, handler: logging.Handler, interval_s: float, clock: Clock) -> None:
        self._handler = handler
        self._interval_s = interval_s
        self._clock = clock
        self._next = clock.monotonic()
        self._suppressed = 0
        self._lock = threading.Lock()  # emitting threads and AgentHandler's shipper report

    def report(
        self,
        record: logging.LogRecord,
        message: str,
        cause: BaseException | None,
        *,
        final: bool = False,
    ) -> None:
        """Report a failure, unless one was reported within the interval; a `final` one
        (records lost as the handler closes) always goes through."""
        with self._lock:
            now = self._clock.monotonic()
            if now < self._next and not final:
                self._suppressed += 1
                return
            self._next = now + self._interval_s
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            message += f"; {suppressed} more failures since the last report"
        try:
            raise LogDeliveryError(message) from cause
        except LogDeliveryError:
            self._handler.handleError(record)


class _Settings:
    """The checks both handlers make on their settings: each error names its setting."""

    def __init__(self, handler: str) -> None:
        self._handler = handler

    def topic(self, topic: object) -> str:
        try:
            return validate_topic(topic)
        except InvalidTopicError as exc:
            raise InvalidTopicError(f"{self._handler}: topic={topic!r}: {exc}") from None

    def key_attribute(self, name: object) -> str | None:
        if name is None or (isinstance(name, str) and name.isidentifier()):
            return name
        raise ValueError(
            f"{self._handler}: key_attribute={name!r}: must be the name of a record "
            "attribute (given with extra=), or None for keyless events"
        )

    def positive(self, name: str, value: object) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        raise ValueError(f"{self._handler}: {name}={value!r}: must be a positive number")

    def count(self, name: str, value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError(f"{self._handler}: {name}={value!r}: must be an integer of at least 1")


def _key_of(record: logging.LogRecord, attribute: str | None) -> str | None:
    if attribute is None:
        return None
    value = getattr(record, attribute, None)
    return None if value is None else str(value)


class SpoolHandler(logging.Handler):
    """Each record is spooled with `Spool.send()` before `emit()` returns.

    `spool` is an open `Spool`, shared with the application, or a directory: the
    handler then opens a spool of its own there (with a sender to `bootstrap_servers`)
    and closes it in `close()`. Once `emit()` returned, the record survives a SIGKILL
    of the process. A record the spool refuses (full with policy `reject`, closed, too
    large) is lost: it is counted in `dropped` and reported through `handleError`.
    """

    def __init__(
        self,
        spool: Spool | str | os.PathLike[str],
        topic: str,
        *,
        bootstrap_servers: str | None = None,
        key_attribute: str | None = None,
        error_interval_s: float = DEFAULT_ERROR_INTERVAL_S,
        level: int | str = logging.NOTSET,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        check = _Settings(type(self).__name__)
        self.topic = check.topic(topic)
        self.key_attribute = check.key_attribute(key_attribute)
        interval = check.positive("error_interval_s", error_interval_s)
        if not isinstance(spool, Spool | str | os.PathLike):
            raise ValueError(
                f"{type(self).__name__}: spool={spool!r}: must be a Spool or a directory"
            )
        if isinstance(spool, Spool) and bootstrap_servers is not None:
            raise ValueError(
                f"{type(self).__name__}: bootstrap_servers={bootstrap_servers!r}: only for a "
                "spool the handler opens itself (spool given as a directory)"
            )
        # Opened before logging knows the handler: one that failed is never closed by it.
        self._owns_spool = not isinstance(spool, Spool)
        self.spool = spool if isinstance(spool, Spool) else Spool(spool, bootstrap_servers)
        super().__init__(level)
        self.addFilter(_not_eventspools_own)
        self.dropped = 0
        self._count_lock = threading.Lock()  # emit() runs in many threads at once
        self._reports = _Reports(self, interval, clock)
        self.setFormatter(JsonFormatter())

    def handle(self, record: logging.LogRecord) -> bool:
        """As `logging.Handler.handle`, without holding the handler's lock around `emit`:
        `Spool.send()` and the formatter are thread-safe, and threads queued on that lock
        pay a context switch per record (a FileHandler needs it, a spool does not)."""
        passed = self.filter(record)
        if isinstance(passed, logging.LogRecord):  # Python 3.12+: a filter may replace it
            record = passed
        if passed:
            self.emit(record)
        return bool(passed)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.spool.send(
                self.topic, self.format(record).encode(), _key_of(record, self.key_attribute)
            )
        except RecursionError:
            raise
        except Exception as exc:
            with self._count_lock:
                self.dropped += 1
                dropped = self.dropped
            self._reports.report(
                record, f"{dropped} log records not spooled to topic {self.topic!r} in all", exc
            )

    def close(self) -> None:
        """Close the spool if the handler opened it; unsent records stay in it for later."""
        try:
            if self._owns_spool:
                self.spool.close()
        finally:
            super().close()


class AgentHandler(logging.Handler):
    """Records are buffered and shipped to the agent at `socket_path` by a thread of the handler.

    `emit()` formats the record and appends it to a buffer of at most `buffer_size`
    records, and returns: it never waits for the agent. The handler's thread sends what
    the buffer holds in batches of up to `batch_size` with one `Client.send_many()`; a
    batch the agent did not answer (dead, restarting, no answer within `timeout`) stays
    at the head of the buffer and is sent again, after a pause that doubles up to 1 s,
    so the records of a key keep their order. A record whose batch was written before
    the agent died may be spooled twice (at least once). Records are lost, counted in
    `dropped` and reported, only when the buffer is full or the agent refuses them for
    good (too large); a full agent spool is retried like a dead agent.

    `flush()` waits up to `timeout` for the buffer to empty; `close()` flushes first,
    and `logging.shutdown()` (run at exit) closes every handler.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        topic: str,
        *,
        key_attribute: str | None = None,
        buffer_size: int = 100_000,
        batch_size: int = 1000,
        timeout: float = 5.0,
        error_interval_s: float = DEFAULT_ERROR_INTERVAL_S,
        level: int | str = logging.NOTSET,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        check = _Settings(type(self).__name__)
        self.topic = check.topic(topic)
        self.key_attribute = check.key_attribute(key_attribute)
        self.buffer_size = check.count("buffer_size", buffer_size)
        self.batch_size = check.count("batch_size", batch_size)
        self.timeout = check.positive("timeout", timeout)
        interval = check.positive("error_interval_s", error_interval_s)
        if not isinstance(socket_path, str | os.PathLike):
            raise ValueError(f"{type(self).__name__}: socket_path={socket_path!r}: not a path")
        super().__init__(level)
        self.addFilter(_not_eventspools_own)
        self.socket_path = os.fspath(socket_path)
        self.dropped = 0
        self.failed_attempts = 0
        self.sent = 0
        self._client = Client(self.socket_path, timeout=self.timeout)
        self._buffer: deque[tuple[bytes, str | None]] = deque()
        # One lock for the buffer and the counters; the shipper waits for records on
        # `_filled`, flush() for an empty buffer on `_emptied`.
        self._buffer_lock = threading.Lock()
        self._filled = threading.Condition(self._buffer_lock)
        self._emptied = threading.Condition(self._buffer_lock)
        self._stopping = False
        self._reports = _Reports(self, interval, clock)
        self.setFormatter(JsonFormatter())
        self._shipper = threading.Thread(
            target=self._ship, name=f"eventspool-log-{self.topic}", daemon=True
        )
        self._shipper.start()

    @property
    def pending(self) -> int:
        """Records in the buffer: not yet answered by the agent."""
        return len(self._buffer)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            key = _key_of(record, self.key_attribute)
            value = self.format(record).encode()
            event_payload(self.topic, value, key, None)  # a bad event fails here, not its batch
            with self._buffer_lock:
                if len(self._buffer) >= self.buffer_size:
                    self.dropped += 1
                    raise LogDeliveryError(
                        f"the buffer for the agent at {self.socket_path} is full "
                        f"({self.buffer_size} records); {self.dropped} records dropped in all"
                    )
                self._buffer.append((value, key))
                self._filled.notify()
        except RecursionError:
            raise
        except Exception as exc:
            self._reports.report(record, f"log record not buffered for the agent: {exc}", exc)

    def flush(self) -> None:
        """Wait up to `timeout` for the agent to have every buffered record."""
        deadline = time.monotonic() + self.timeout
        with self._buffer_lock:
            while self._buffer and self._shipper.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._emptied.wait(left)

    def close(self) -> None:
        """Flush, stop the shipping thread and disconnect; what is left is reported lost,
        always (it is the last word on those records), with how long close() waited."""
        started = time.monotonic()
        try:
            self.flush()
            with self._buffer_lock:
                self._stopping = True
                self._filled.notify()
            self._shipper.join(self.timeout)
            self._client.close()
            with self._buffer_lock:
                left = len(self._buffer)
                self.dropped += left
            if left:
                self._reports.report(
                    self._failure_record(),
                    f"{left} log records dropped: still buffered for the agent at "
                    f"{self.socket_path} when the handler closed, after waiting "
                    f"{time.monotonic() - started:.1f} s for it (timeout={self.timeout:g})",
                    None,
                    final=True,
                )
        finally:
            super().close()

    # ---- the shipping thread -------------------------------------------------------------

    def _ship(self) -> None:
        pause = 0.0
        while True:
            with self._buffer_lock:
                resume = time.monotonic() + pause
                while not self._stopping and (left := resume - time.monotonic()) > 0:
                    self._filled.wait(left)  # close() cuts the pause short
                while not self._buffer and not self._stopping:
                    self._filled.wait()
                if self._stopping:
                    return
                batch = [self._buffer[i] for i in range(min(self.batch_size, len(self._buffer)))]
            pause = self._send(batch, pause)

    def _send(self, batch: list[tuple[bytes, str | None]], pause: float) -> float:
        """Send the head of the buffer (only this thread removes from it); the next pause."""
        next_pause = min(max(pause * 2, _FIRST_RETRY_PAUSE_S), _MAX_RETRY_PAUSE_S)
        try:
            outcomes = self._client.send_many(self.topic, batch)
        except Exception as exc:  # AgentError mostly; the batch stays in the buffer either way
            with self._buffer_lock:
                self.failed_attempts += 1
                waiting = len(self._buffer)
            self._reports.report(
                self._failure_record(),
                f"{waiting} log records wait for the agent at {self.socket_path} "
                f"({self.failed_attempts} failed attempts in all)",
                exc,
            )
            return next_pause
        retry = [
            event
            for event, outcome in zip(batch, outcomes, strict=True)
            if isinstance(outcome, _RETRYABLE)
        ]
        failures = [outcome for outcome in outcomes if not isinstance(outcome, str)]
        refused = len(failures) - len(retry)
        with self._buffer_lock:
            for _ in batch:
                self._buffer.popleft()
            self._buffer.extendleft(reversed(retry))
            self.sent += len(batch) - len(failures)
            self.dropped += refused
            if not self._buffer:
                self._emptied.notify_all()
        if failures:
            self._reports.report(
                self._failure_record(),
                f"the agent at {self.socket_path} refused {len(failures)} log records: "
                f"{len(retry)} are retried, {refused} dropped ({self.dropped} in all)",
                failures[0],
            )
        return next_pause if retry else 0.0

    def _failure_record(self) -> logging.LogRecord:
        """The record `handleError` prints beside the error: the failing ones are gone."""
        return logging.makeLogRecord({"name": __name__, "msg": f"shipping to {self.topic}"})
