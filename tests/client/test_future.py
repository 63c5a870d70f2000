"""LazyFuture behaves as a concurrent.futures.Future, whichever side comes first.

Each case runs on a plain Future too, so the expectations are Future's own, not ours.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time
from concurrent.futures import (
    CancelledError,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from eventspool.client.future import LazyFuture

KINDS = [pytest.param(Future, id="Future"), pytest.param(LazyFuture, id="LazyFuture")]


@pytest.mark.parametrize("kind", KINDS)
def test_settled_before_anyone_looks(kind: type[Future[str]]) -> None:
    done, failed = kind(), kind()
    assert not done.done()
    assert not done.running()
    done.set_result("id")
    failed.set_exception(ValueError("refused"))
    assert done.done()
    assert failed.done()
    assert not done.cancelled()
    assert done.result(0) == "id"
    assert done.exception(0) is None
    assert isinstance(failed.exception(0), ValueError)
    with pytest.raises(ValueError, match="refused"):
        failed.result(0)
    with pytest.raises(InvalidStateError):
        done.set_result("again")
    with pytest.raises(InvalidStateError):
        failed.set_exception(ValueError("again"))
    assert not done.cancel()
    assert "finished" in repr(done)


@pytest.mark.parametrize("kind", KINDS)
def test_a_waiter_blocked_before_the_result_is_woken(kind: type[Future[str]]) -> None:
    future = kind()
    with pytest.raises(FutureTimeout):
        future.result(0.01)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(future.result(10)))
    waiter.start()
    threading.Timer(0.05, future.set_result, ("late",)).start()
    waiter.join(10)
    assert got == ["late"]


@pytest.mark.parametrize("kind", KINDS)
def test_callbacks_run_once_before_and_after_settling(
    kind: type[Future[str]], caplog: pytest.LogCaptureFixture
) -> None:
    future = kind()
    calls: list[tuple[str, Future[str]]] = []
    future.add_done_callback(lambda f: calls.append(("before", f)))
    future.add_done_callback(lambda f: 1 / 0)  # logged, never raised
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        future.set_result("id")
    future.add_done_callback(lambda f: calls.append(("after", f)))
    assert calls == [("before", future), ("after", future)]
    assert "exception calling callback" in caplog.text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", [1, 2, 3])
def test_callbacks_added_before_a_waiter_blocks_run_once_in_order(
    kind: type[Future[int]], count: int
) -> None:
    """Callbacks kept before the future had a condition are the ones settling runs then."""
    future = kind()
    calls: list[int] = []
    for n in range(count):
        future.add_done_callback(lambda f, n=n: calls.append(n))  # type: ignore[misc]
    waiter = threading.Thread(target=future.result, args=(10,))
    waiter.start()
    while isinstance(future, LazyFuture) and future._lazy_condition is None:
        time.sleep(0.001)  # until result() made the condition it blocks on
    future.add_done_callback(lambda f: calls.append(-1))
    future.set_result(1)
    waiter.join(10)
    assert calls == [*range(count), -1]


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_before_the_answer(kind: type[Future[str]]) -> None:
    future = kind()
    cancelled: list[bool] = []
    future.add_done_callback(lambda f: cancelled.append(f.cancelled()))
    assert future.cancel()
    assert cancelled == [True]
    with pytest.raises(CancelledError):
        future.result(0)
    with pytest.raises(InvalidStateError):
        future.set_result("too late")


@pytest.mark.parametrize("kind", KINDS)
def test_wait_and_as_completed_accept_it(kind: type[Future[str]]) -> None:
    settled, pending, late = kind(), kind(), kind()
    settled.set_result("a")
    done, not_done = wait([settled, pending], timeout=0.01)
    assert (done, not_done) == ({settled}, {pending})
    threading.Timer(0.05, late.set_result, ("c",)).start()
    assert [f.result() for f in as_completed([settled, late], timeout=10)] == ["a", "c"]


def test_waiting_on_settled_futures_makes_no_condition_per_future() -> None:
    """wait() and as_completed() take each future's condition; a settled LazyFuture
    lends a shared one, which a pending future in the same call must not disturb."""
    settled: list[LazyFuture[int]] = [LazyFuture() for _ in range(1000)]
    for n, future in enumerate(settled):
        future.set_result(n)
    pending: LazyFuture[int] = LazyFuture()
    threading.Timer(0.05, pending.set_result, (-1,)).start()
    done, not_done = wait([*settled, pending], timeout=10)
    assert (len(done), not_done) == (1001, set())
    plain: list[Future[int]] = list(settled)
    assert sorted(f.result() for f in as_completed(plain, timeout=10)) == list(range(1000))
    assert all(future._lazy_condition is None for future in settled)
    assert not settled[0].cancel()
    with pytest.raises(InvalidStateError):
        settled[0].set_result(0)


def test_a_future_nobody_waits_on_makes_no_list() -> None:
    """Future's lists of waiters and callbacks exist only once something is in them: each
    is one more object for the cyclic collector while the future lives."""
    called: list[int] = []
    future: LazyFuture[int] = LazyFuture()
    future.add_done_callback(lambda done: called.append(done.result()))
    future.set_result(7)
    assert (future.result(), called) == (7, [7])
    bare: LazyFuture[int] = LazyFuture()
    bare.set_result(8)
    assert bare.result() == 8
    for each in (future, bare):
        assert (each._lazy_waiters, each._callbacks, each._lazy_condition) == (None, None, None)
    done, _ = wait([bare], timeout=1)
    assert done == {bare}


def test_overlapping_waits_over_settled_and_pending_futures_never_deadlock() -> None:
    """wait() takes its futures' conditions in id order; settled futures must not share
    a real lock, or two calls that overlap in a pending future take locks in opposite
    orders. Threads keep waiting on fresh settled futures plus one pending future that
    another thread keeps settling and replacing; each must keep making progress."""
    rounds = [0] * 4
    shared: list[LazyFuture[int]] = [LazyFuture()]
    stop = threading.Event()

    def waiter(slot: int) -> None:
        while not stop.is_set():
            mine: list[Future[int]] = []
            for n in range(6):
                future: LazyFuture[int] = LazyFuture()
                future.set_result(n)
                mine.append(future)
            wait([*mine, shared[0]], timeout=0)
            rounds[slot] += 1

    def settler() -> None:
        while not stop.is_set():
            old, shared[0] = shared[0], LazyFuture()
            old.set_result(0)
            stop.wait(0.0002)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=waiter, args=(n,), daemon=True) for n in range(4)]
    threads.append(threading.Thread(target=settler, daemon=True))
    try:
        for thread in threads:
            thread.start()
        for _ in range(6):
            before = list(rounds)
            stop.wait(0.5)
            assert all(a < b for a, b in zip(before, rounds, strict=True)), "a waiter is stuck"
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        for thread in threads:
            thread.join(5)


@pytest.mark.parametrize("kind", KINDS)
def test_settling_races_waiters_and_callbacks(kind: type[Future[int]]) -> None:
    """Whatever the order, every waiter gets the result and every callback runs once."""
    rng = random.Random(7)
    futures = [kind() for _ in range(2000)]
    seen: list[int] = []
    called = [0] * len(futures)
    lock = threading.Lock()

    def watch(indexes: list[int]) -> None:
        for index in indexes:
            if index % 2:
                seen.append(futures[index].result(10))
            else:

                def note(_: Future[int], index: int = index) -> None:
                    with lock:
                        called[index] += 1

                futures[index].add_done_callback(note)

    def settle() -> None:
        for index, future in enumerate(futures):
            future.set_result(index)

    order = list(range(len(futures)))
    rng.shuffle(order)
    threads = [threading.Thread(target=watch, args=(order[n::4],)) for n in range(4)]
    threads.append(threading.Thread(target=settle))
    rng.shuffle(threads)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(seen) == list(range(1, len(futures), 2))
    assert called == [1 if index % 2 == 0 else 0 for index in range(len(futures))]


def test_a_forked_child_settles_futures_though_the_parent_held_their_locks() -> None:
    """Futures share a set of locks; one held at the fork would stay held in the child,
    so a child takes a fresh set."""
    held = [LazyFuture[str]()._lock for _ in range(64)]  # each of the set once
    for lock in held:
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: settle fresh futures, or hang until killed
            signal.alarm(10)
            futures = [LazyFuture[str]() for _ in range(64)]
            for future in futures:
                future.set_result("settled")
            os._exit(0 if all(f.result(0) == "settled" for f in futures) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        for lock in held:
            lock.release()
    assert os.waitstatus_to_exitcode(status) == 0
