"""Threads released together by one barrier, timed from the release to the last one's end.

Every pass of N threads runs this way, whatever each thread does, so its rate always
means the same: what the threads did over that wall time.
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
    """One pass: each thread's result, monotonic ns times (shared by all processes), CPU."""

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

    `stop` is set `stop_after_s` after the release, for work that loops until told. The
    barrier opens no earlier than `release_at_ns`, so passes of several processes begin
    together. A thread's exception is raised once every thread ended.
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
