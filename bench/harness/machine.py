"""What the numbers were measured on: CPU, cores, memory, file system, load (Linux /proc)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def _cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Hardware", "cpu model"):
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def filesystem_type(path: Path) -> str:
    """The type of the file system holding `path` (ext4, xfs, tmpfs...), or "unknown"."""
    with open("/proc/mounts", encoding="utf-8") as handle:
        mounts = [line.split()[1:3] for line in handle]
    target = path.resolve()
    # The longest mount point holding `path`; of equal ones the last, which hides the others.
    holding = [
        (len(mount), n, kind)
        for n, (mount, kind) in enumerate(mounts)
        if target.is_relative_to(mount.replace("\\040", " "))
    ]
    return max(holding)[2] if holding else "unknown"


def load_average_1m() -> float | None:
    """The 1-minute load average: how busy the machine was besides the benchmark."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine() -> dict[str, object]:
    """What the numbers were measured on: CPU model, cores, memory, OS and Python."""
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
