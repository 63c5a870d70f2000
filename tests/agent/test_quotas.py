"""Quotas delay, never refuse, and hold a client to its byte rate (with a test clock)."""

from __future__ import annotations

import pytest

from eventspool.agent.quotas import Quotas
from eventspool.clock import ManualClock


def _drive(quotas: Quotas, clock: ManualClock, client: str, topic: str, seconds: int) -> float:
    """Send 100 kB every 10 ms as fast as the throttle allows; return the achieved rate."""
    sent = 0
    start = clock.monotonic()
    while clock.monotonic() - start < seconds:
        delay = quotas.record(client, topic, 100_000)
        sent += 100_000
        clock.advance(max(delay, 0.01))
    return sent / (clock.monotonic() - start)


def test_a_client_over_its_quota_is_slowed_to_it() -> None:
    clock = ManualClock()
    quotas = Quotas(client_bytes_per_s=1_000_000, topic_bytes_per_s={}, clock=clock)
    rate = _drive(quotas, clock, "pid-1", "orders", seconds=60)
    assert rate == pytest.approx(1_000_000, rel=0.1)
    assert quotas.counters.throttled_responses > 0
    assert quotas.counters.throttle_seconds > 30


def test_clients_are_throttled_separately() -> None:
    clock = ManualClock()
    quotas = Quotas(client_bytes_per_s=1_000_000, topic_bytes_per_s={}, clock=clock)
    _drive(quotas, clock, "greedy", "orders", seconds=20)
    assert quotas.record("polite", "orders", 1000) == 0.0


def test_a_topic_quota_binds_all_clients_of_that_topic_only() -> None:
    clock = ManualClock()
    quotas = Quotas(client_bytes_per_s=None, topic_bytes_per_s={"logs": 500_000}, clock=clock)
    rate = _drive(quotas, clock, "any", "logs", seconds=60)
    assert rate == pytest.approx(500_000, rel=0.1)
    assert quotas.record("any", "orders", 10_000_000) == 0.0


def test_no_quota_no_delay() -> None:
    quotas = Quotas(client_bytes_per_s=None, topic_bytes_per_s={})
    assert not quotas.enabled
    assert quotas.record("c", "t", 10**9) == 0.0
    assert quotas.counters.throttled_responses == 0
