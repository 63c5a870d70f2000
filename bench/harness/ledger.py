"""What a SIGKILL took: the rules every kill bench scores its ledgers by.

A killed process records each event it was told was acknowledged in a ledger file
(`eventspool.testing.ledger`); the parent reads the topics back and compares event ids
(`eventspool.verify.ledger`). The figures built from that comparison are defined here.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from eventspool.verify import ledger
from harness.runs import median


def delivered_fraction(delivered: int, acknowledged: int) -> float:
    """The share of acknowledged events found in Kafka; 1.0 when nothing was acknowledged
    (the count reported beside it tells that run apart)."""
    return delivered / acknowledged if acknowledged else 1.0


@dataclass(frozen=True, slots=True)
class Tally:
    """What became of the events one killed process had acknowledged."""

    acknowledged: int
    delivered: int
    lost: int
    duplicated: int
    unacknowledged_delivered: int  # in Kafka, but its sender never learned it got there

    @property
    def delivered_fraction(self) -> float:
        return delivered_fraction(self.delivered, self.acknowledged)


def tally(
    acknowledged: Collection[str], seen: Counter[str], *, ignore: Collection[str] = ()
) -> Tally:
    """Compare the acknowledged ids with the ids found in Kafka (`seen`, with copies);
    `ignore` names ids found that no sender wrote (a marker)."""
    book = ledger(acknowledged, seen)
    acked = set(acknowledged)
    extra = sum(1 for event_id in seen if event_id not in acked and event_id not in ignore)
    return Tally(book.sent, book.delivered, book.lost, book.duplicated, extra)


def summary(tallies: Sequence[Tally]) -> dict[str, float | int]:
    """Medians over kills, plus the worst loss and the worst delivered fraction."""
    return {
        "kills": len(tallies),
        "acknowledged": median(t.acknowledged for t in tallies),
        "delivered_fraction": round(median(t.delivered_fraction for t in tallies), 6),
        "delivered_fraction_min": round(min(t.delivered_fraction for t in tallies), 6),
        "lost": median(t.lost for t in tallies),
        "lost_max": max(t.lost for t in tallies),
        "duplicated": median(t.duplicated for t in tallies),
        "unacknowledged_delivered": median(t.unacknowledged_delivered for t in tallies),
    }


@dataclass(frozen=True, slots=True)
class KillLoss:
    """The acknowledged events one kill took, and the age of the oldest at the kill."""

    lost: int
    window_ms: float


def losses_by_kill(
    lost_acked_at: Iterable[float], kill_times: Sequence[float]
) -> tuple[list[KillLoss], int]:
    """Each lost event charged to the first kill after its acknowledgement: one entry per
    kill, and the count acknowledged after the last kill, which no kill explains."""
    lost: list[int] = [0] * len(kill_times)
    oldest: list[float] = [0.0] * len(kill_times)
    after_last = 0
    for acked_at in lost_acked_at:
        index = bisect.bisect_left(kill_times, acked_at)
        if index == len(kill_times):
            after_last += 1
            continue
        lost[index] += 1
        oldest[index] = max(oldest[index], kill_times[index] - acked_at)
    return [
        KillLoss(count, round(age * 1000, 1)) for count, age in zip(lost, oldest, strict=True)
    ], after_last


def loss_spread(losses: Sequence[int]) -> dict[str, float]:
    """Median, mean and most acknowledged events one kill took (empty for no kills)."""
    if not losses:
        return {}
    return {
        "median": median(losses),
        "mean": round(sum(losses) / len(losses), 1),
        "max": max(losses),
    }


def lost_ratio(ours_lost: float, anchor_lost: float) -> float:
    """(anchor + 1) / (ours + 1): above 1 when we lose fewer; the +1 keeps zero finite."""
    return round((anchor_lost + 1) / (ours_lost + 1), 4)


def lost_figure(
    name: str, ours_lost: float, anchor_lost: float, *, title: str, anchor_is: str
) -> dict[str, object]:
    """A figure of acknowledged events lost: lower is better, and the anchor's count is
    where a random kill happened to land."""
    return {
        "figure": name,
        "ours": ours_lost,
        "anchor": anchor_lost,
        "ratio": lost_ratio(ours_lost, anchor_lost),
        "unit": "events",
        "higher_is_better": False,
        "title": title,
        "anchor_is": anchor_is,
        "ratio_definition": "(anchor_lost + 1) / (ours_lost + 1)",
        "random_anchor": True,
    }
