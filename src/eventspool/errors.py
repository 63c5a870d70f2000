"""Exceptions raised to callers of eventspool.

Every error names what was wrong (the topic, the file, the size), so that the caller
can act on it without reading logs. Nothing already acknowledged is affected by any of them.
"""

from __future__ import annotations


class EventspoolError(Exception):
    """Base class of every error eventspool raises on purpose."""


class InvalidEventError(EventspoolError, ValueError):
    """The event itself is unacceptable: bad topic name, wrong value type, too large."""


class InvalidTopicError(InvalidEventError):
    """The topic name breaks Kafka's naming rules."""


class EventTooLargeError(InvalidEventError):
    """The event is over `max_event_bytes` (or the queue's own record limit)."""


class SpoolFullError(EventspoolError):
    """A queue has no room and its policy is `reject`, or `block` timed out."""


class SpoolBudgetError(SpoolFullError):
    """A new queue would take the spool over its disk budget (`max_spool_bytes`) or its
    `max_topics`; the queues that exist keep working."""


class AgentError(EventspoolError):
    """The agent could not be reached, or failed in a way that is not the event's fault."""


class ForbiddenError(EventspoolError):
    """The agent's access rules do not allow this topic or exchange."""


class SpoolClosedError(EventspoolError):
    """The spool or queue was closed; nothing more is accepted."""


class SpoolLockedError(EventspoolError):
    """Another process owns the spool directory."""


class QueueFileError(EventspoolError):
    """A queue file cannot be created, opened or trusted (disk full, corrupt header)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class DiskFullError(QueueFileError):
    """A new queue file does not fit on the disk (ENOSPC).

    The queues that exist keep working: only events that need a new queue are refused.
    """


class CorruptQueueError(QueueFileError):
    """The header of a queue file is damaged; the file is left untouched for inspection."""


class InvalidExchangeError(EventspoolError, ValueError):
    """An exchange declaration is unacceptable: bad name, type, binding key or topic."""


class UnknownExchangeError(InvalidEventError):
    """`send()` named an exchange that is not declared; nothing was written."""


class UnroutableError(EventspoolError):
    """The event matched no binding and its exchange has no alternate topic.

    Nothing was written; the event is counted as refused. Configure `alternate_topic`
    to keep such events instead.
    """


class ExchangeConflictError(EventspoolError):
    """A runtime declaration or deletion of an exchange that the configuration declares.

    The configuration is the source of truth for the exchanges it names: change them there.
    """
