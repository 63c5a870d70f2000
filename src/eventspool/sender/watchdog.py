"""When the sender gives up on its producer and starts a new one.

librdkafka's idempotent producer can stop for good (a fatal error, e.g. a sequence
desynchronization after a broker restart) or retry for ever (a broker that lost its
state fences it: PRODUCER_FENCED, UNKNOWN_PRODUCER_ID). Either way no event is
acknowledged again until a new producer takes over, so the sender replaces it after a
fatal error, or after `producer_reset_after_s` without an acknowledgement while queues
of available partitions hold events and the brokers answer metadata.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

# A cluster that is only slow must not see a new producer every few seconds: each reset
# that brings no acknowledgement doubles the wait, up to this.
MAX_RESET_AFTER_S = 300.0


class ProducerWatchdog:
    """Says when to replace the producer; the sender tells it what happened, and when."""

    def __init__(self, reset_after_s: float, now: float) -> None:
        self._first_reset_after_s = reset_after_s
        self.reset_after_s = reset_after_s
        self.fatal: KafkaError | None = None  # cleared by replaced()
        self._last_ack = now  # or the last moment there was nothing to acknowledge

    def acknowledged(self, now: float) -> None:
        """An event was acknowledged: the producer works, the wait starts over."""
        self._last_ack = now
        self.reset_after_s = self._first_reset_after_s

    def nothing_to_acknowledge(self, now: float) -> None:
        """No queue holds an event the producer could deliver: silence proves nothing."""
        self._last_ack = now

    def reason_to_replace(self, now: float, *, brokers_answer: bool) -> str | None:
        """Why the producer should be replaced now, or None to keep it.

        Answering for the missing acknowledgements doubles the next wait, so call it only
        when the answer is acted on.
        """
        if self.fatal is not None:
            return f"fatal producer error: {self.fatal.str()}"
        silent_s = now - self._last_ack
        if brokers_answer and silent_s >= self.reset_after_s:
            self.reset_after_s = min(self.reset_after_s * 2, MAX_RESET_AFTER_S)
            return f"no event acknowledged for {silent_s:.0f} s while the brokers answer"
        return None

    def replaced(self, now: float) -> None:
        """A new producer took over: it gets the whole wait before it is judged."""
        self.fatal = None
        self._last_ack = now
