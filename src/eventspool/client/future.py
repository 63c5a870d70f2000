"""A `concurrent.futures.Future` that makes its condition only when a caller must wait.

`Client.send_async()` returns a future per event, and most are settled before anybody
looks at them. A plain Future builds a `threading.Condition` (and its lock) in its
constructor: a fifth of the client's CPU per event, measured. This one builds it only
when a caller has to block (`result()` or `exception()` before it is settled,
`concurrent.futures.wait()`, `as_completed()`) or for `cancel()`; a future settled
before that lends a condition that holds nothing, as nothing about it can change.
Settling, callbacks and reading a settled future take a plain lock of the future's own
instead. It stays a real Future, so every function of `concurrent.futures` accepts it.

The lock is the future's own, not one for the module: callers adding callbacks and the
reader settling futures would otherwise queue on one lock, and a thread that loses the
interpreter lock while holding it stalls all of them (measured with 8 caller threads:
85% of their time spent waiting in `add_done_callback`).

It relies on Future's internals as CPython writes them (`_condition`, `_state`,
`_result`, `_exception`, `_done_callbacks`): `tests/client/test_future.py` runs the
public behaviour against it, so a Python release that changes them fails there first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, LOGGER, PENDING
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: A future's done callbacks: none, the only one, or a list of them.
_Callbacks = Callable[[Future[T]], object] | list[Callable[[Future[T]], object]] | None


class LazyFuture(Future[T]):
    """A Future whose condition is made on first blocking use."""

    def __init__(self) -> None:  # not Future.__init__: it would build the condition
        # Held for a few instructions: to make the condition, or to settle or watch the
        # future while it has none. While that is None nobody can be blocked on it.
        self._lock = threading.Lock()
        self._lazy_condition: threading.Condition | None = None
        self._state = PENDING
        self._result: T | None = None
        self._exception: BaseException | None = None
        # Future's two lists, made on first use: most futures never need either, and
        # every object the collector tracks costs the process time while it lives. A
        # single callback, the usual case, is kept as it is, without a list.
        self._lazy_waiters: list[Any] | None = None
        self._callbacks: _Callbacks[T] = None

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        condition = self._lazy_condition
        if condition is None:
            with self._lock:  # decided once: settled without one, it never gets one
                condition = self._lazy_condition
                if condition is None:
                    if self._state == FINISHED:
                        return _SETTLED
                    condition = self._lazy_condition = threading.Condition()
        return condition

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        waiters = self._lazy_waiters
        if waiters is None:
            with self._lock:
                waiters = self._lazy_waiters
                if waiters is None:
                    waiters = self._lazy_waiters = []
        return waiters

    @property
    def _done_callbacks(self) -> list[Callable[[Future[T]], object]]:
        callbacks = self._callbacks
        if not isinstance(callbacks, list):
            with self._lock:
                callbacks = self._callbacks
                if callbacks is None:
                    callbacks = self._callbacks = []
                elif not isinstance(callbacks, list):
                    callbacks = self._callbacks = [callbacks]
        return callbacks

    def done(self) -> bool:
        return self._state in _DONE

    def running(self) -> bool:
        return False  # the agent's answer is pending or has come: never "running"

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result  # type: ignore[return-value]  # set with the state
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with self._lock:
            if self._lazy_condition is None and self._state == PENDING:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = fn
                elif isinstance(callbacks, list):
                    callbacks.append(fn)
                else:
                    self._callbacks = [callbacks, fn]
                return
        if self._lazy_condition is None:  # settled without a condition: call it now
            _call(fn, self)
        else:
            super().add_done_callback(fn)

    def set_result(self, result: T) -> None:
        with self._lock:
            unwatched = self._lazy_condition is None
            if unwatched:
                _check_pending(self)
                self._result = result
                self._state = FINISHED
                callbacks, self._callbacks = self._callbacks, None
        if unwatched:
            _call_all(callbacks, self)
        else:
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        with self._lock:
            unwatched = self._lazy_condition is None
            if unwatched:
                _check_pending(self)
                self._exception = exception
                self._state = FINISHED
                callbacks, self._callbacks = self._callbacks, None
        if unwatched:
            _call_all(callbacks, self)
        else:
            super().set_exception(exception)


_DONE = frozenset({CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED})


class _SettledCondition:
    """The condition of every future settled before anybody had to wait on it: what
    `concurrent.futures.wait()` and `as_completed()` hold while they read its state,
    which never changes again, so there is nothing to lock. A real lock shared by such
    futures would break the order in which `wait()` takes the futures' locks, and two
    overlapping `wait()` calls would deadlock."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self) -> bool:
        return True

    def __exit__(self, *exc_info: object) -> None:
        pass

    def notify(self, n: int = 1) -> None:
        pass

    def notify_all(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        return True  # settled: whatever is waited for has happened


_SETTLED = cast(threading.Condition, _SettledCondition())


def _check_pending(future: Future[Any]) -> None:
    """Settling twice is an error, as on a Future; cancelling needs the condition."""
    state = future._state
    if state != PENDING:  # not repr(future): it takes the condition, under the lock
        raise InvalidStateError(f"{state}: the future is settled already")


def _call_all(callbacks: _Callbacks[T], future: Future[T]) -> None:
    """The callbacks of a future settled without a condition, in the order added."""
    if isinstance(callbacks, list):
        for fn in callbacks:
            _call(fn, future)
    elif callbacks is not None:
        _call(callbacks, future)


def _call(fn: Callable[[Future[T]], object], future: Future[T]) -> None:
    """A done callback, as Future runs it: its error is logged, not raised."""
    try:
        fn(future)
    except Exception:
        LOGGER.exception("exception calling callback for %r", future)
