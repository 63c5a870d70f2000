"""eventspool: hand an event to a durable local spool and go on; a sender ships it to Kafka."""

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

# No NullHandler on the "eventspool" logger: where the application configured no logging,
# Python's own last resort prints warnings and errors to stderr, and a spool that cannot
# reach its brokers, or a queue that stalls, must not stay silent. librdkafka's repeats
# are cut to one line per broker and kind per 30 s (kafkalog.py).
