"""eventspool: hand an event to a durable local spool and go on; a sender ships it to Kafka."""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
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


def __getattr__(name: str) -> object:
    """`Spool` is imported on first use: a process that only talks to the agent (a CLI
    tool, a cron job, Spark's Python workers) does not load the spool, the sender and
    their libraries, 0.14 s of such a process's start here."""
    if name == "Spool":
        from eventspool.pipeline import Spool  # noqa: PLC0415  # deferred on purpose

        return Spool
    raise AttributeError(f"module 'eventspool' has no attribute {name!r}")


# No NullHandler on the "eventspool" logger: where the application configured no logging,
# Python's own last resort prints warnings and errors to stderr, and a spool that cannot
# reach its brokers, or a queue that stalls, must not stay silent. librdkafka's repeats
# are cut to one line per broker and kind per 30 s (kafkalog.py).
