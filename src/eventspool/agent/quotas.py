"""Byte-rate quotas per client and per topic, enforced as Kafka brokers do: by delay.

A client over its quota is not refused: its response is held back just long enough
that its rate over the sampling window falls to the quota (Kafka's throttle time,
KIP-13/KIP-219), and nothing else is read from that connection meanwhile. Throttle time
is counted, so an operator sees who is being slowed down.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from eventspool.clock import SYSTEM_CLOCK, Clock

WINDOW_SAMPLES = 11
SAMPLE_SECONDS = 1.0


class RateWindow:
    """Bytes over the last `WINDOW_SAMPLES` sample intervals, like Kafka's quota sensor."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, size: int) -> None:
        now = self._clock.monotonic()
        start = now - now % SAMPLE_SECONDS
        if self._samples and self._samples[-1][0] == start:
            self._samples[-1] = (start, self._samples[-1][1] + size)
        else:
            self._samples.append((start, size))
        horizon = start - (WINDOW_SAMPLES - 1) * SAMPLE_SECONDS
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()

    def delay_for(self, quota: int) -> float:
        """Seconds to wait so that the window's bytes divided by its length meet `quota`."""
        if not self._samples:
            return 0.0
        total = sum(size for _, size in self._samples)
        elapsed = max(self._clock.monotonic() - self._samples[0][0], SAMPLE_SECONDS)
        return max(0.0, total / quota - elapsed)


@dataclass(slots=True)
class ThrottleCounters:
    throttled_responses: int = 0
    throttle_seconds: float = 0.0


class Quotas:
    def __init__(
        self,
        client_bytes_per_s: int | None,
        topic_bytes_per_s: Mapping[str, int],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._client_quota = client_bytes_per_s
        self._topic_quotas = dict(topic_bytes_per_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: dict[str, RateWindow] = {}
        self._topics: dict[str, RateWindow] = {}
        self.counters = ThrottleCounters()

    @property
    def enabled(self) -> bool:
        return self._client_quota is not None or bool(self._topic_quotas)

    def record(self, client: str, topic: str | None, size: int) -> float:
        """Account `size` bytes and return how long to hold the response (0: none).

        `topic` None (a publish through an exchange) counts against the client only.
        """
        delay = 0.0
        with self._lock:
            if self._client_quota is not None:
                window = self._clients.setdefault(client, RateWindow(self._clock))
                window.add(size)
                delay = window.delay_for(self._client_quota)
            if topic is not None and (topic_quota := self._topic_quotas.get(topic)) is not None:
                window = self._topics.setdefault(topic, RateWindow(self._clock))
                window.add(size)
                delay = max(delay, window.delay_for(topic_quota))
            if delay > 0:
                self.counters.throttled_responses += 1
                self.counters.throttle_seconds += delay
        return delay

    def forget(self, client: str) -> None:
        """Drop a disconnected client's window, so memory follows live connections."""
        with self._lock:
            self._clients.pop(client, None)
