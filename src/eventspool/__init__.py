"""eventspool: hand an event to a durable local spool and go on; a sender ships it to Kafka."""

# Not bound as `logging`: that name is our submodule's, and logging.config's dictConfig
# resolves "eventspool.logging.SpoolHandler" by attribute before it imports.
import logging as _stdlib_logging

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
from eventspool.pipeline import Spool

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
_stdlib_logging.getLogger("eventspool").addHandler(_stdlib_logging.NullHandler())
