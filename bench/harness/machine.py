"""What the numbers were measured on: CPU, cores, memory, file system, load (Linux /proc)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1024 * 1024), 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def filesystem_type(path: Path) -> str:
    """The type of the file system holding `path` (ext4, xfs, tmpfs...), or "unknown"."""
    try:
        target = path.resolve()
        best_mount = ""
        best_type = "unknown"
        with open("/proc/mounts", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                if (target == Path(mount) or Path(mount) in target.parents) and len(mount) >= len(
                    best_mount
                ):
                    best_mount, best_type = mount, fields[2]
        return best_type
    except OSError:
        return "unknown"


def load_average_1m() -> float | None:
    """The 1-minute load average: how busy the machine was besides the benchmark."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine() -> dict[str, object]:
    """What the numbers were measured on: CPU model, cores, memory, OS and Python."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
