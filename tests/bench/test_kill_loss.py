"""The arithmetic of the SIGKILL bench: one kill's tally, the medians and the ratios."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.ledger import tally
from kill_loss import ANCHOR, OURS, WAIT_EACH, WAIT_LANE, KillLedger, figures, lane_summary


def _kill(lane: str, lost: int, rate: float, acknowledged: int = 100) -> KillLedger:
    return KillLedger(acknowledged, acknowledged - lost, lost, 0, 0, lane, 0, 1.0, rate)


def test_a_ledger_counts_lost_duplicated_and_unacknowledged_events() -> None:
    seen = Counter({"a": 1, "b": 2, "x": 1, "marker": 1})
    kill = tally(["a", "b", "c"], seen, ignore={"marker"})
    assert (kill.acknowledged, kill.delivered, kill.lost) == (3, 2, 1)
    assert kill.duplicated == 1
    assert kill.unacknowledged_delivered == 1  # "x": in Kafka, never acknowledged
    assert kill.delivered_fraction == pytest.approx(2 / 3)


def test_lane_summary_takes_medians_and_the_worst_kill() -> None:
    summary = lane_summary([_kill(ANCHOR, lost, 10.0) for lost in (0, 5, 100)])
    assert summary["lost"] == 5
    assert summary["lost_max"] == 100
    assert summary["delivered_fraction"] == pytest.approx(0.95)
    assert summary["delivered_fraction_min"] == pytest.approx(0.0)
    assert summary["backlog_at_reopen"] is None


def test_ratios_are_above_one_when_the_spool_is_ahead() -> None:
    lanes = {
        OURS: lane_summary([_kill(OURS, 0, 200.0)]),
        ANCHOR: lane_summary([_kill(ANCHOR, 99, 400.0)]),
        WAIT_EACH: lane_summary([_kill(WAIT_EACH, 0, 4.0)]),
        WAIT_LANE: lane_summary([_kill(WAIT_LANE, 0, 100.0)]),
    }
    by_name = {figure["figure"]: figure for figure in figures(lanes)}
    lost = by_name["sigkill_acknowledged_events_lost_per_kill"]
    assert (lost["ours"], lost["anchor"], lost["ratio"]) == (0, 99, 100.0)  # (99+1)/(0+1)
    assert by_name["acknowledged_rate_vs_producer_waiting_for_each_delivery"]["ratio"] == 50.0
    assert by_name["acknowledged_rate_vs_producer_waiting_per_100"]["ratio"] == 2.0
    assert by_name["acknowledged_rate_vs_bare_producer"]["ratio"] == 0.5
