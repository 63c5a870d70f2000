"""`CoreLock`, the blocking client's lock that compiled code takes without a Python call,
must behave as `threading.Lock` does wherever the pipeline uses it: `with`, a try-lock,
`locked()`, a timed wait, and under a `threading.Condition`."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import CoreLock

_STEPS = st.lists(st.sampled_from(["try", "release", "locked", "timed"]), max_size=30)


@given(_STEPS)
def test_one_thread_sees_what_threading_lock_would_show(steps: list[str]) -> None:
    ours, theirs = CoreLock(), threading.Lock()
    for step in steps:
        results: list[object] = []
        for lock in (ours, theirs):
            try:
                if step == "try":
                    results.append(lock.acquire(blocking=False))
                elif step == "release":
                    results.append(lock.release())
                elif step == "locked":
                    results.append(lock.locked())
                else:
                    results.append(lock.acquire(timeout=0.001))
            except RuntimeError:
                results.append("RuntimeError")
        assert results[0] == results[1], step


def test_a_timed_acquire_gives_up_after_its_timeout_and_takes_a_lock_let_go() -> None:
    lock = CoreLock()
    assert lock.acquire()
    started = time.monotonic()
    assert not lock.acquire(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 5
    threading.Timer(0.1, lock.release).start()  # another thread may let go, as with Lock
    assert lock.acquire(timeout=5)
    lock.release()


def test_a_timeout_without_blocking_is_refused_as_threading_lock_refuses_it() -> None:
    with pytest.raises(ValueError, match="timeout"):
        CoreLock().acquire(blocking=False, timeout=1)


def test_threads_that_take_it_exclude_each_other() -> None:
    lock = CoreLock()
    inside = 0
    most_inside = 0

    def work() -> None:
        nonlocal inside, most_inside
        for _ in range(200):
            with lock:
                inside += 1
                most_inside = max(most_inside, inside)
                time.sleep(0)  # hand the interpreter lock to the others while holding it
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most_inside == 1


def test_a_condition_on_it_waits_notifies_and_times_out() -> None:
    lock = CoreLock()
    wanted = threading.Condition(lock)  # type: ignore[arg-type]  # any acquire/release lock
    woken: list[bool] = []

    def waiter() -> None:
        with wanted:
            woken.append(wanted.wait(10))
            assert lock.locked()  # taken back on waking

    thread = threading.Thread(target=waiter)
    thread.start()
    while not woken and thread.is_alive():
        with wanted:
            wanted.notify()
        time.sleep(0.01)
    thread.join(10)
    assert woken == [True]
    with wanted:
        assert not wanted.wait(0.05)
        assert lock.locked()
    assert not lock.locked()
