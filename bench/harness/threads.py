"""Threads released together by one barrier, timed from the release to the last one's end.

Every pass of N threads is run this way, whatever each thread does (a batch of its own,
or a loop until told to stop), so its rate always means the same: what the threads did
over the wall time from their release to the end of the last of them.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Together(Generic[T]):
    """One pass: each thread's result in slot order, monotonic ns times (which every
    process shares, so passes of several processes combine) and this process's CPU."""

    results: list[T]
    start_ns: int
    end_ns: int
    cpu_s: float

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def run_together(
    work: Sequence[Callable[[], T]],
    *,
    stop: threading.Event | None = None,
    stop_after_s: float = 0,
    release_at_ns: int | None = None,
) -> Together[T]:
    """Run each of `work` in a thread of its own, all released at once by a barrier.

    With `stop`, it is set `stop_after_s` after the release, for work that loops until it
    is told; a call in progress then is counted and timed. With `release_at_ns` (monotonic
    time, which every process shares) the barrier opens no earlier, so passes in several
    processes begin together. A thread's exception is raised once every thread ended.
    """
    barrier = threading.Barrier(len(work) + 1)
    results: list[T | None] = [None] * len(work)
    ends = [0] * len(work)
    errors: list[BaseException] = []

    def run(slot: int) -> None:
        barrier.wait()
        try:
            results[slot] = work[slot]()
        except BaseException as exc:
            errors.append(exc)
        ends[slot] = time.monotonic_ns()

    threads = [threading.Thread(target=run, args=(n,), name=f"bench-{n}") for n in range(len(work))]
    for thread in threads:
        thread.start()
    gc.collect()  # not a collection left over from the set-up, in the timed region
    if release_at_ns is not None:
        time.sleep(max(0.0, (release_at_ns - time.monotonic_ns()) / 1e9))
    cpu = time.process_time()
    barrier.wait()
    start_ns = time.monotonic_ns()
    if stop is not None:
        stop.wait(stop_after_s)
        stop.set()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return Together(cast(list[T], results), start_ns, max(ends), time.process_time() - cpu)
