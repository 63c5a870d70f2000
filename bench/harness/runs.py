"""Repetitions and what is made of them: values by name, medians, percentiles, alternation.

Ours and the anchor take turns going first (`alternate`), so a disturbance that favours
one pass (a cold cache, a busy broker) hits both sides alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import TypeVar

Side = TypeVar("Side")


def alternate(rep: int, sides: Sequence[Side]) -> list[Side]:
    """`sides` in their order on even repetitions, reversed on odd ones."""
    return list(sides) if rep % 2 == 0 else list(reversed(sides))


class Runs:
    """Per-repetition values by figure name; each figure is reported as their median."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, name: str, value: float | None) -> None:
        """Note one repetition's value; None (not measured this time) is left out."""
        if value is not None:
            self.values.setdefault(name, []).append(value)

    def medians(self) -> dict[str, float]:
        return {name: median(values) for name, values in self.values.items()}

    def listed(self, *suffixes: str) -> dict[str, list[float]]:
        """Every repetition's value, rounded, of the names ending with one of `suffixes`
        (all of them without): the "runs" a result shows beside its medians."""
        return {
            name: [round(value, 3) for value in values]
            for name, values in self.values.items()
            if not suffixes or name.endswith(suffixes)
        }


def median(values: Iterable[float]) -> float:
    """The median of `values` (the mean of the two middle ones for an even count)."""
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float:
    """The `q`-th percentile (0..100) of `values`, interpolated linearly between ranks as
    numpy's default; `presorted` skips the sort for several percentiles of one sample."""
    data = values if presorted else sorted(values)
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def latency_summary_us(samples_ns: Iterable[int]) -> dict[str, float]:
    """p50, p99, p99.9 and max of nanosecond samples, in microseconds, plus the count."""
    data = sorted(samples_ns)
    return {
        "p50_us": round(percentile(data, 50.0, presorted=True) / 1000.0, 3),
        "p99_us": round(percentile(data, 99.0, presorted=True) / 1000.0, 3),
        "p999_us": round(percentile(data, 99.9, presorted=True) / 1000.0, 3),
        "max_us": round(data[-1] / 1000.0, 3),
        "samples": len(data),
    }


def safe_ratio(numerator: float, denominator: float, digits: int = 4) -> float | None:
    """`numerator / denominator` rounded, or None when the denominator is not positive."""
    if denominator <= 0:
        return None
    return round(numerator / denominator, digits)
