"""A `concurrent.futures.Future` that makes its condition only when a caller must wait.

`Client.send_async()` returns a future per event, and most are settled before anybody
looks at them. A plain Future builds a `threading.Condition` (and its lock) in its
constructor: a fifth of the client's CPU per event, measured. This one builds it only
when a caller has to block (`result()` or `exception()` before it is settled,
`concurrent.futures.wait()`, `as_completed()`) or for `cancel()`; a future settled
before that lends a condition that holds nothing, as nothing about it can change.
Settling and callbacks take a plain lock instead, and reading a settled future takes
none. It stays a real Future, so every function of `concurrent.futures` accepts it.

The lock is one of a set the futures take in turn, not one for the module: callers
adding callbacks and the reader settling futures would otherwise queue on one lock, and a
thread that loses the interpreter lock while holding it stalls all of them (measured
with 8 caller threads: 85% of their time spent waiting in `add_done_callback`). Nor is
it a lock per future: that is a second object per event for the cyclic collector to
walk. It is held for a few instructions, and nothing is acquired while it is held, so
futures that share one cannot deadlock. A forked child gets a fresh set: a lock another
thread held at the fork would stay held there.

It relies on Future's internals as CPython writes them (`_condition`, `_state`,
`_result`, `_exception`, `_done_callbacks`): `tests/client/test_future.py` runs the
public behaviour against it, so a Python release that changes them fails there first.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, LOGGER, PENDING
from typing import Any, TypeVar, cast

T = TypeVar("T")

_LOCK_COUNT = 64


def _lock_cycle() -> itertools.cycle[threading.Lock]:
    return itertools.cycle([threading.Lock() for _ in range(_LOCK_COUNT)])


_locks = _lock_cycle()


def _renew_locks() -> None:
    global _locks  # noqa: PLW0603  # replaced whole in a forked child, never changed else
    _locks = _lock_cycle()


os.register_at_fork(after_in_child=_renew_locks)

#: A future's done callbacks: none, the only one, or a list of them.
_Callbacks = Callable[[Future[T]], object] | list[Callable[[Future[T]], object]] | None


class LazyFuture(Future[T]):
    """A Future whose condition is made on first blocking use."""

    def __init__(self) -> None:  # not Future.__init__: it would build the condition
        # Held for a few instructions: to make the condition, or to settle or watch the
        # future while it has none. While that is None nobody can be blocked on it.
        self._lock = next(_locks)
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
        lock = self._lock
        lock.acquire()  # not `with`: it makes two bound methods per call (callgrind)
        try:
            if self._lazy_condition is None and self._state == PENDING:
                callbacks = self._callbacks
                if callbacks is None:
                    self._callbacks = fn
                elif isinstance(callbacks, list):
                    callbacks.append(fn)
                else:
                    self._callbacks = [callbacks, fn]
                return
        finally:
            lock.release()
        if self._lazy_condition is None:  # settled without a condition: call it now
            _call(fn, self)
        else:
            super().add_done_callback(fn)

    def set_result(self, result: T) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._finish(None, exception)

    def _finish(self, result: T | None, exception: BaseException | None) -> None:
        """Settle with a result, or with an exception if one is given: a future nobody
        waits on without its condition, running its callbacks here (one call per event on
        the client's reader, not a chain of helpers); one with a condition Future's way."""
        lock = self._lock
        lock.acquire()  # as in add_done_callback
        try:
            watched = self._lazy_condition is not None
            if not watched:
                if self._state != PENDING:  # not repr(self): it takes the condition
                    raise InvalidStateError(f"{self._state}: the future is settled already")
                self._result = result
                self._exception = exception
                self._state = FINISHED
                callbacks, self._callbacks = self._callbacks, None
        finally:
            lock.release()
        if watched:
            if exception is None:
                super().set_result(cast(T, result))
            else:
                super().set_exception(exception)
            return
        if callbacks is None:
            return
        for fn in callbacks if isinstance(callbacks, list) else (callbacks,):
            try:
                fn(self)
            except Exception:
                LOGGER.exception("exception calling callback for %r", self)


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


def _call(fn: Callable[[Future[T]], object], future: Future[T]) -> None:
    """A done callback, as Future runs it: its error is logged, not raised."""
    try:
        fn(future)
    except Exception:
        LOGGER.exception("exception calling callback for %r", future)
