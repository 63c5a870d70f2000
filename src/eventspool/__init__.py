"""eventspool: hand an event to a durable local spool and go on; a sender ships it to Kafka."""

import logging

from eventspool.config import Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.errors import (
    CorruptQueueError,
    EventspoolError,
    EventTooLargeError,
    ExchangeConflictError,
    InvalidEventError,
    InvalidExchangeError,
    InvalidTopicError,
    QueueFileError,
    SpoolClosedError,
    SpoolFullError,
    SpoolLockedError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.spool.api import Spool

__all__ = [
    "CorruptQueueError",
    "Durability",
    "EventTooLargeError",
    "EventspoolError",
    "ExchangeConflictError",
    "FullPolicy",
    "InvalidEventError",
    "InvalidExchangeError",
    "InvalidTopicError",
    "QueueFileError",
    "QueueSettings",
    "Spool",
    "SpoolClosedError",
    "SpoolFullError",
    "SpoolLockedError",
    "SpoolSettings",
    "UnknownExchangeError",
    "UnroutableError",
]

# A library logs; the application decides where that goes (no lastResort output).
logging.getLogger("eventspool").addHandler(logging.NullHandler())
