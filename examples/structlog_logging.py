"""structlog events, rendered to JSON, shipped to Kafka through `SpoolHandler`.

structlog hands each event to the standard library's logging; its `ProcessorFormatter`
with a `JSONRenderer` is the handler's formatter, so the event's value in Kafka is
structlog's own JSON, bound context included.
Runs against an embedded broker and exits once the events are read back from Kafka.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import structlog

from eventspool import Spool
from eventspool.broker import LocalBroker, create_topic
from eventspool.logging import SpoolHandler
from eventspool.verify import consume_event_ids

TOPIC = "app-logs"


def configure(spool: Spool) -> None:
    """structlog into logging, and logging's records into the spool as structlog's JSON."""
    handler = SpoolHandler(spool, TOPIC)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ]
        )
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch, LocalBroker(Path(scratch) / "broker") as broker:
        create_topic(broker.bootstrap_servers, TOPIC, 1)
        with Spool(Path(scratch) / "spool", broker.bootstrap_servers) as spool:
            configure(spool)
            log = structlog.get_logger("shop")
            for n in range(3):
                log.info("order placed", order=n, amount=10 * n)
            spool.flush(timeout=30)
            logging.getLogger().handlers.clear()

        values: list[dict[str, object]] = []

        def read(message: object) -> str:
            values.append(json.loads(message.value()))  # type: ignore[attr-defined]
            return str(len(values))

        consume_event_ids(broker.bootstrap_servers, [TOPIC], ["3"], timeout=60, id_of=read)
    for value in values:
        print(value["event"], value["order"], value["amount"], value["level"])


if __name__ == "__main__":
    main()
