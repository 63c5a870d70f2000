"""Flow control: how many events are held, and when intake waits, pauses and resumes.

Every event taken in is held until it is finished, dropped or forwarded; `max_buffered`
bounds them, and with them the duplicates a rebalance can cause. A full buffer first
gets `pause_grace_s` to drain while consume() is not called; one that stays full pauses
every assigned partition, and consume() goes on (returning nothing) so the member stays
in its group however long handlers take, until the count falls to `resume_fraction`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import TopicPartition

from eventspool.consumer.assignment import PartitionState
from eventspool.consumer.handle import KafkaConsumerHandle
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerCounters


class FlowControl:
    """The held count against `max_buffered`, and the pause that keeps it bounded."""

    def __init__(
        self,
        settings: ConsumerSettings,
        counters: ConsumerCounters,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._counters = counters
        self._monotonic = monotonic
        self.held = 0
        self.paused = False
        self._full_since: float | None = None

    def hold(self, state: PartitionState, count: int = 1) -> None:
        state.held += count
        self.held += count

    def release(self, state: PartitionState, count: int = 1) -> None:
        state.held -= count
        self.held -= count

    def hold_intake(self, kafka: KafkaConsumerHandle) -> bool:
        """Back-pressure: True while this step must not call consume().

        A full buffer first gets `pause_grace_s` to drain without a pause, because pausing
        throws away what librdkafka prefetched and a resumed partition fetches again only
        after up to a second; a buffer that stays full is paused, and consume() goes on
        (returning nothing) so the member stays in its group however long handlers take.
        """
        limit = self._settings.max_buffered
        if self.paused:
            if self.held <= limit * self._settings.resume_fraction:
                self.set_paused(kafka, False)
            return False
        if self.held < limit:
            self._full_since = None
            return False
        now = self._monotonic()
        if self._full_since is None:
            self._full_since = now
        if now - self._full_since < self._settings.pause_grace_s:
            return True
        self._full_since = None
        self.set_paused(kafka, True)
        return False

    def set_paused(self, kafka: KafkaConsumerHandle, paused: bool) -> None:
        assignment = kafka.assignment()
        if assignment:
            (kafka.pause if paused else kafka.resume)(assignment)
        self.paused = paused
        self._counters.pauses += paused

    def apply_to(self, kafka: KafkaConsumerHandle, partitions: list[TopicPartition]) -> None:
        """Give newly assigned partitions the pause as it stands. librdkafka keeps a
        partition paused through its revocation and a new assignment: one taken away
        while paused and given back after the pause ended was never fetched again."""
        (kafka.pause if self.paused else kafka.resume)(partitions)
