"""What each answer status of the agent means as an exception, in both directions.

The agent turns a failed send into a status; both clients turn it back into the same
exception class, so a caller catches the same errors in-process and through the agent.
"""

from __future__ import annotations

from collections.abc import Mapping

from eventspool.errors import (
    AgentError,
    DiskFullError,
    EventspoolError,
    EventTooLargeError,
    ForbiddenError,
    InvalidEventError,
    InvalidTopicError,
    SpoolBudgetError,
    SpoolClosedError,
    SpoolFullError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.wire.protocol import EventResult, Status

#: The status of a failed send: the first matching class, most specific first.
_STATUS_OF_ERROR: tuple[tuple[type[Exception], Status], ...] = (
    (DiskFullError, Status.NO_SPACE),
    (SpoolBudgetError, Status.OVER_BUDGET),
    (InvalidTopicError, Status.INVALID_TOPIC),
    (EventTooLargeError, Status.TOO_LARGE),
    (UnknownExchangeError, Status.UNKNOWN_EXCHANGE),
    (InvalidEventError, Status.MALFORMED),
    (UnroutableError, Status.UNROUTABLE),
    (SpoolFullError, Status.SPOOL_FULL),
    (SpoolClosedError, Status.SHUTTING_DOWN),
)


def status_for(exc: Exception) -> Status | None:
    """The status the agent answers for a refused send; None for an unexpected error."""
    for kind, status in _STATUS_OF_ERROR:
        if isinstance(exc, kind):
            return status
    return None


_ERRORS: Mapping[Status, type[EventspoolError]] = {
    Status.SPOOL_FULL: SpoolFullError,
    Status.NO_SPACE: SpoolFullError,
    Status.OVER_BUDGET: SpoolBudgetError,
    Status.FORBIDDEN: ForbiddenError,
    Status.INVALID_TOPIC: InvalidTopicError,
    Status.TOO_LARGE: EventTooLargeError,
    Status.MALFORMED: InvalidEventError,
    Status.SHUTTING_DOWN: SpoolClosedError,
    Status.INTERNAL: AgentError,
    Status.UNKNOWN_EXCHANGE: UnknownExchangeError,
    Status.UNROUTABLE: UnroutableError,
}


def error_for(status: Status, text: str) -> EventspoolError:
    """The exception a refused event's status stands for, the same in both clients."""
    return _ERRORS.get(status, AgentError)(text)


def raise_for(result: EventResult) -> str:
    """The event id of an OK result; the matching exception otherwise."""
    if result.status is Status.OK:
        return result.text
    raise error_for(result.status, result.text)
