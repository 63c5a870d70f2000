"""eventspool: hand an event to a durable local spool and go on; a sender ships it to Kafka."""

import logging

from eventspool.config import Durability, FullPolicy, QueueSettings, SpoolSettings
from eventspool.errors import (
    CorruptQueueError,
    EventspoolError,
    EventTooLargeError,
    InvalidEventError,
    InvalidTopicError,
    QueueFileError,
    SpoolClosedError,
    SpoolFullError,
    SpoolLockedError,
)
from eventspool.spool.api import Spool

__all__ = [
    "CorruptQueueError",
    "Durability",
    "EventTooLargeError",
    "EventspoolError",
    "FullPolicy",
    "InvalidEventError",
    "InvalidTopicError",
    "QueueFileError",
    "QueueSettings",
    "Spool",
    "SpoolClosedError",
    "SpoolFullError",
    "SpoolLockedError",
    "SpoolSettings",
]

# A library logs; the application decides where that goes (no lastResort output).
logging.getLogger("eventspool").addHandler(logging.NullHandler())
