"""CPU time of a process or of this process's threads, read from Linux /proc, and what a
timed window used (`cpu_window`).

`time.process_time()` only sees this process; the agent, rsyslogd and the broker are
processes of their own, and the split by thread needs /proc/self/task.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_ticks(stat_path: str) -> tuple[str, int] | None:
    """(command name, utime + stime in clock ticks) from a /proc .../stat file."""
    try:
        with open(stat_path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < 0:
        return None
    fields = text[close_paren + 2 :].split()
    try:
        return text[open_paren + 1 : close_paren], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def thread_ticks() -> dict[int, tuple[str, int]]:
    """CPU ticks of every thread of this process, by native thread id (empty off Linux)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        entry = _stat_ticks(f"/proc/self/task/{tid}/stat")
        if entry is not None and tid.isdigit():
            out[int(tid)] = entry
    return out


def process_ticks(pid: int) -> int | None:
    """User + system CPU ticks of every thread of process `pid` so far; None if gone."""
    entry = _stat_ticks(f"/proc/{pid}/stat")
    return None if entry is None else entry[1]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of process `pid` so far (0 if gone)."""
    return (process_ticks(pid) or 0) / CLOCK_TICKS


@dataclass(slots=True)
class CpuWindow:
    """What one timed window used: wall and CPU seconds of this process (and of the
    calling thread alone), its threads' CPU summed by group, another process's CPU, minor
    page faults, and the wall time and generation-2 runs of the cyclic garbage collector."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    caller_cpu_s: float = 0.0
    threads_s: dict[str, float] = field(default_factory=dict)
    other_cpu_s: float | None = None
    minor_faults: int = 0
    gc_s: float = 0.0
    gc_gen2_collections: int = 0


@contextmanager
def cpu_window(other_pid: int, groups: Mapping[int | None, str]) -> Iterator[CpuWindow]:
    """Measure the block. `groups` names the group of some native thread ids (None: a
    thread that does not exist, whose group is still reported, at 0); of the others,
    librdkafka's threads (named rdk:*) are summed as "librdkafka_threads", the rest as
    "other"."""
    window = CpuWindow()
    gc_began = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_began[0] = time.perf_counter()
        else:
            window.gc_s += time.perf_counter() - gc_began[0]
            window.gc_gen2_collections += info["generation"] == 2

    gc.callbacks.append(on_gc)
    threads, other = thread_ticks(), process_ticks(other_pid)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    caller, cpu, wall = time.thread_time(), time.process_time(), time.perf_counter()
    try:
        yield window
    finally:
        window.wall_s = time.perf_counter() - wall
        window.cpu_s = time.process_time() - cpu
        window.caller_cpu_s = time.thread_time() - caller
        gc.callbacks.remove(on_gc)
    window.minor_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    if (other_end := process_ticks(other_pid)) is not None and other is not None:
        window.other_cpu_s = (other_end - other) / CLOCK_TICKS
    split = dict.fromkeys([*groups.values(), "librdkafka_threads", "other"], 0.0)
    for tid, (name, ticks) in thread_ticks().items():
        group = groups.get(tid, "librdkafka_threads" if name.startswith("rdk:") else "other")
        split[group] += (ticks - threads.get(tid, (name, 0))[1]) / CLOCK_TICKS
    window.threads_s = split
