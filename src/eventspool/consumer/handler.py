"""What a handler is and how its reference resolves: the poll thread checks it at
construction, and each worker process resolves it again after it starts."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from eventspool.consumer.record import Record
from eventspool.errors import EventspoolError

Handler = Callable[[Record], object]
HandlerRef = str | Handler


class HandlerError(EventspoolError):
    """The handler reference cannot be resolved to a callable."""


def is_async(handler: Handler) -> bool:
    """An `async def` function (also behind functools.partial) runs concurrently."""
    return inspect.iscoroutinefunction(handler)


def resolve_handler(ref: HandlerRef) -> Handler:
    """`module:function` or a callable (which must be picklable to reach a worker)."""
    if not isinstance(ref, str):
        if not callable(ref):
            raise HandlerError(f"handler {ref!r} is not callable")
        return ref
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise HandlerError(f"handler {ref!r}: expected 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise HandlerError(f"handler {ref!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerError(f"handler {ref!r}: {module_name!r} has no {attribute!r}") from None
    if not callable(target):
        raise HandlerError(f"handler {ref!r} is not callable")
    handler: Handler = target
    return handler
