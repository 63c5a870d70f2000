"""What a SIGKILL took: the rules every kill bench scores its ledgers by.

A killed process records each event it was told was acknowledged in a ledger file
(`eventspool.testing.ledger`, which a SIGKILL cannot cut short); the parent reads the
topics back and compares event ids (`eventspool.verify.ledger`). The figures built from
that comparison are defined here once.
"""

from __future__ import annotations


def delivered_fraction(delivered: int, acknowledged: int) -> float:
    """The share of acknowledged events found in Kafka.

    Nothing acknowledged means nothing was lost: 1.0. A run that acknowledged nothing is
    told apart by the count of acknowledged events reported beside the fraction, not by
    the fraction.
    """
    return delivered / acknowledged if acknowledged else 1.0


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
