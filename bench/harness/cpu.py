"""CPU time of another process or of this process's threads, which `time.process_time()`
cannot see, read from Linux /proc; and what a timed window used (`cpu_window`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_ticks(stat_path: str) -> tuple[str, int] | None:
    """(command name, utime + stime in clock ticks) from a /proc stat file; None if gone."""
    try:
        with open(stat_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # The name is in parentheses and may hold any character, ")" too.
    name, _, rest = text.partition("(")[2].rpartition(")")
    fields = rest.split()
    return name, int(fields[11]) + int(fields[12])


def thread_ticks() -> dict[int, tuple[str, int]]:
    """CPU ticks of every thread of this process, by native thread id."""
    ticks = {
        tid: _stat_ticks(f"/proc/self/task/{tid}/stat") for tid in os.listdir("/proc/self/task")
    }
    return {int(tid): entry for tid, entry in ticks.items() if entry is not None}


def process_ticks(pid: int) -> int | None:
    """User + system CPU ticks of every thread of process `pid` so far; None if gone."""
    entry = _stat_ticks(f"/proc/{pid}/stat")
    return None if entry is None else entry[1]


def process_run_s(pid: int) -> float:
    """Seconds the threads of process `pid` alive now have run (their schedstat, in
    nanoseconds): for windows of milliseconds, where clock ticks are too coarse. Threads
    that ended are not counted."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as handle:
                total += int(handle.read().split()[0])
        except OSError:
            continue
    return total / 1e9


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of process `pid` so far (0 if gone)."""
    return (process_ticks(pid) or 0) / CLOCK_TICKS


@dataclass(slots=True)
class CpuWindow:
    """What one timed window used: wall and CPU seconds of this process and of the calling
    thread, its threads' CPU by group, and another process's CPU."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    caller_cpu_s: float = 0.0
    threads_s: dict[str, float] = field(default_factory=dict)
    other_cpu_s: float | None = None


@contextmanager
def cpu_window(other_pid: int, groups: Mapping[int | None, str]) -> Iterator[CpuWindow]:
    """Measure the block. `groups` names the group of some native thread ids (a None id's
    group is reported at 0); librdkafka's threads (rdk:*) are "librdkafka_threads", the
    rest "other"."""
    window = CpuWindow()
    threads, other = thread_ticks(), process_ticks(other_pid)
    caller, cpu, wall = time.thread_time(), time.process_time(), time.perf_counter()
    try:
        yield window
    finally:
        window.wall_s = time.perf_counter() - wall
        window.cpu_s = time.process_time() - cpu
        window.caller_cpu_s = time.thread_time() - caller
    if (other_end := process_ticks(other_pid)) is not None and other is not None:
        window.other_cpu_s = (other_end - other) / CLOCK_TICKS
    split = dict.fromkeys([*groups.values(), "librdkafka_threads", "other"], 0.0)
    for tid, (name, ticks) in thread_ticks().items():
        group = groups.get(tid, "librdkafka_threads" if name.startswith("rdk:") else "other")
        split[group] += (ticks - threads.get(tid, (name, 0))[1]) / CLOCK_TICKS
    window.threads_s = split
