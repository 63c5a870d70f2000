"""CPU time of a process or of this process's threads, read from Linux /proc.

`time.process_time()` only sees this process; the agent, rsyslogd and the broker are
processes of their own, and the split by thread needs /proc/self/task.
"""

from __future__ import annotations

import os

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
