"""eventspool.logging: records as JSON events, failures reported not raised, dictConfig.

Real spools on real files and a real agent process; the records are read back from the
spool's ring or from Kafka, never from a stand-in.
"""

from __future__ import annotations

import json
import logging
import logging.config
import queue
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from logging.handlers import QueueHandler, QueueListener
from pathlib import Path
from typing import Any

import pytest

from eventspool.broker import LocalBroker
from eventspool.clock import ManualClock
from eventspool.config import QueueSettings, SpoolSettings
from eventspool.envelope import Event, decode
from eventspool.logging import AgentHandler, JsonFormatter, SpoolHandler
from eventspool.pipeline import Spool
from eventspool.verify import consume_event_ids
from tests.agent import conftest as agent_fixtures
from tests.agent.conftest import AgentFactory

# pytest collects fixtures from module attributes by attribute name (see tests/client).
agent_factory = agent_fixtures.agent_factory

TOPIC = "app-logs"


@pytest.fixture
def logger(request: pytest.FixtureRequest) -> Iterator[logging.Logger]:
    """A logger of the test's own that does not propagate; its handlers closed after it."""
    log = logging.getLogger(f"test.{request.node.name}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A unix socket path has at most 107 bytes: pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="eventspool-log-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def spooled(spool: Spool, topic: str = TOPIC) -> list[Event]:
    """Every event queued for `topic`, in ring order."""
    events: list[Event] = []
    for ref in spool.queues():
        if ref.topic == topic:
            ref.ring.rewind()
            while batch := ref.ring.read_batch(max_records=100_000, max_bytes=1 << 30):
                events.extend(decode(record.payload) for record in batch)
    return events


def value_of(event: Event) -> dict[str, Any]:
    assert event.value is not None
    decoded = json.loads(event.value)
    assert isinstance(decoded, dict)
    return decoded


def test_a_record_becomes_one_json_event_with_its_fields(
    tmp_path: Path, logger: logging.Logger
) -> None:
    with Spool(tmp_path / "spool") as spool:
        spool.set_partition_count(TOPIC, 1)
        logger.addHandler(SpoolHandler(spool, TOPIC, key_attribute="request_id"))
        logger.info("user %s logged in", "ada", extra={"request_id": "r-17", "n": 3})
        try:
            raise KeyError("missing")
        except KeyError:
            logger.exception("lookup failed")
        logger.warning("no key here")
        first, second, third = spooled(spool)

    fields = value_of(first)
    assert first.key == b"r-17"
    assert fields["message"] == "user ada logged in"
    assert fields["level"] == "INFO"
    assert fields["logger"] == logger.name
    assert fields["extra"] == {"request_id": "r-17", "n": 3}
    assert fields["time"].endswith("+00:00")
    assert isinstance(fields["process"], int) and isinstance(fields["thread"], int)
    error = value_of(second)["exception"]
    assert error["type"] == "KeyError" and error["message"] == "'missing'"
    assert 'raise KeyError("missing")' in error["traceback"]
    assert third.key is None and "extra" not in value_of(third)


def test_the_formatter_can_be_replaced(tmp_path: Path, logger: logging.Logger) -> None:
    with Spool(tmp_path / "spool") as spool:
        spool.set_partition_count(TOPIC, 1)
        handler = SpoolHandler(spool, TOPIC)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.error("disk %d%% full", 93)
        (event,) = spooled(spool)
    assert event.value == b"ERROR disk 93% full"


def test_a_full_spool_is_counted_and_reported_at_a_bounded_rate(
    tmp_path: Path, logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    """The application never sees the error; stderr gets one report per interval."""
    clock = ManualClock()
    settings = SpoolSettings(max_event_bytes=16_000, queue=QueueSettings(capacity_bytes=65_536))
    with Spool(tmp_path / "spool", settings=settings) as spool:
        spool.set_partition_count(TOPIC, 1)
        handler = SpoolHandler(spool, TOPIC, error_interval_s=60, clock=clock)
        logger.addHandler(handler)
        for n in range(1000):
            logger.info("record %d %s", n, "x" * 200)  # the ring holds about 230 of them
        spooled_count = len(spooled(spool))
        dropped = handler.dropped
        first = capsys.readouterr().err
        clock.advance(61)
        logger.info("one more")
        second = capsys.readouterr().err

    assert dropped == 1000 - spooled_count > 0
    assert handler.dropped == dropped + 1
    assert first.count("--- Logging error ---") == 1
    assert "SpoolFullError" in first and "LogDeliveryError" in first
    assert second.count("--- Logging error ---") == 1
    assert f"{handler.dropped} log records not spooled" in second
    assert f"{handler.dropped - 2} more failures since the last report" in second


def test_it_works_behind_a_queue_listener(tmp_path: Path, logger: logging.Logger) -> None:
    """QueueHandler renders message and traceback before the queue; extras travel along."""
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    with Spool(tmp_path / "spool") as spool:
        spool.set_partition_count(TOPIC, 1)
        listener = QueueListener(records, SpoolHandler(spool, TOPIC, key_attribute="user"))
        logger.addHandler(QueueHandler(records))
        listener.start()
        try:
            logger.info("queued %d", 1, extra={"user": "u1"})
            try:
                1 / 0  # noqa: B018
            except ZeroDivisionError:
                logger.exception("queued failure", extra={"user": "u2"})
        finally:
            listener.stop()
            for handler in listener.handlers:
                handler.close()
        first, second = spooled(spool)

    assert (first.key, value_of(first)["message"]) == (b"u1", "queued 1")
    failure = value_of(second)
    assert second.key == b"u2" and failure["extra"] == {"user": "u2"}
    assert failure["message"].startswith("queued failure\nTraceback")
    assert "ZeroDivisionError" in failure["message"]


def logging_config(
    spool_dir: Path, bootstrap: str, socket_path: Path, topic: str
) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "eventspool.logging.JsonFormatter"}},
        "handlers": {
            "spool": {
                "class": "eventspool.logging.SpoolHandler",
                "spool": str(spool_dir),
                "bootstrap_servers": bootstrap,
                "topic": topic,
                "key_attribute": "request_id",
                "formatter": "json",
            },
            "agent": {
                "class": "eventspool.logging.AgentHandler",
                "socket_path": str(socket_path),
                "topic": topic,
                "key_attribute": "request_id",
                "level": "WARNING",
            },
        },
        "loggers": {"configured": {"handlers": ["spool", "agent"], "level": "INFO"}},
    }


def test_dict_config_starts_both_handlers(
    broker: LocalBroker,
    agent_factory: AgentFactory,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
) -> None:
    topic = topic_factory(2)
    agent = agent_factory(socket_path=short_dir / "agent.sock")
    agent.start()
    config = logging_config(
        tmp_path / "app-spool", broker.bootstrap_servers, agent.socket_path, topic
    )
    logging.config.dictConfig(config)
    log = logging.getLogger("configured")
    try:
        log.info("to the spool only", extra={"request_id": "r1"})
        log.warning("to both", extra={"request_id": "r2"})
    finally:
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()  # AgentHandler flushes to the agent; SpoolHandler to Kafka

    found: list[tuple[bytes | None, str]] = []

    def record(message: Any) -> str:
        found.append((message.key(), json.loads(message.value())["message"]))
        return str(len(found))

    consume_event_ids(broker.bootstrap_servers, [topic], ["3"], timeout=60, id_of=record)
    assert sorted(found) == [(b"r1", "to the spool only"), (b"r2", "to both"), (b"r2", "to both")]


@pytest.mark.parametrize(
    ("handler", "setting", "value"),
    [
        ("spool", "key_attribute", 7),
        ("spool", "topic", "no spaces allowed"),
        ("spool", "error_interval_s", 0),
        ("agent", "buffer_size", 0),
        ("agent", "timeout", "soon"),
        ("agent", "topik", "typo"),
    ],
)
def test_a_bad_setting_names_itself(
    tmp_path: Path, handler: str, setting: str, value: object
) -> None:
    config = logging_config(tmp_path / "spool", "", tmp_path / "agent.sock", TOPIC)
    config["handlers"] = {handler: config["handlers"][handler]}
    config["handlers"][handler][setting] = value
    config["loggers"] = {}
    with pytest.raises(ValueError, match=f"Unable to configure handler '{handler}'") as raised:
        logging.config.dictConfig(config)
    assert setting in str(raised.value.__cause__)


def test_agent_handler_keeps_records_while_no_agent_listens(
    short_dir: Path, logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on the socket: records wait in the buffer, a full buffer is counted."""
    handler = AgentHandler(short_dir / "none.sock", TOPIC, buffer_size=5, timeout=0.2)
    logger.addHandler(handler)
    for n in range(8):
        logger.info("waiting %d", n)
    assert handler.pending == 5
    assert handler.dropped == 3
    logger.removeHandler(handler)
    handler.close()
    assert handler.dropped == 8
    err = capsys.readouterr().err
    assert "the buffer for the agent" in err
    # The last word on the 5 left is never swallowed by the report interval.
    assert "5 log records dropped: still buffered for the agent" in err


def test_json_formatter_writes_what_json_cannot_hold_as_text() -> None:
    record = logging.makeLogRecord({"msg": "at", "where": Path("/x"), "when": {1, 2}})
    fields = json.loads(JsonFormatter().format(record))
    assert fields["extra"] == {"where": "/x", "when": "{1, 2}"}


def test_dict_config_names_the_handlers_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """As a user's logging config does: nothing imported but `logging.config`, so the
    class path alone must resolve (it did not while `eventspool.logging` was shadowed)."""
    script = (
        "import logging, logging.config, sys\n"
        "logging.config.dictConfig({'version': 1, 'handlers': {'spool': {"
        "'class': 'eventspool.logging.SpoolHandler', 'spool': sys.argv[1], "
        "'topic': 'app-logs'}}, 'root': {'handlers': ['spool'], 'level': 'INFO'}})\n"
        "logging.getLogger('app').info('configured')\n"
        "logging.shutdown()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "spool")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with Spool(tmp_path / "spool") as spool:
        assert spool.unacknowledged() == 1


def test_eventspools_own_records_are_not_shipped(tmp_path: Path) -> None:
    """A sender warning logged through a root handler that is a SpoolHandler would go into
    the spool it is about; it is left to the application's other handlers."""
    with Spool(tmp_path) as spool:
        handler = SpoolHandler(spool, TOPIC)
        handler.handle(logging.makeLogRecord({"name": "eventspool.sender.sender", "msg": "x"}))
        handler.handle(logging.makeLogRecord({"name": "eventspool.librdkafka", "msg": "x"}))
        handler.handle(logging.makeLogRecord({"name": "eventspoolish.app", "msg": "kept"}))
        handler.handle(logging.makeLogRecord({"name": "shop", "msg": "kept"}))
        assert spool.unacknowledged() == 2
