"""When the sender replaces its producer: at once after a fatal error, after a silence
while the brokers answer, and less often each time a new producer brings nothing."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from eventspool.sender.watchdog import MAX_RESET_AFTER_S, ProducerWatchdog


def test_a_producer_that_keeps_acknowledging_is_kept() -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    for now in range(5, 100, 5):
        watchdog.acknowledged(float(now))
        assert watchdog.reason_to_replace(float(now) + 9.9, brokers_answer=True) is None


def test_a_silence_while_the_brokers_answer_replaces_the_producer() -> None:
    watchdog = ProducerWatchdog(10.0, now=100.0)
    assert watchdog.reason_to_replace(109.9, brokers_answer=True) is None
    reason = watchdog.reason_to_replace(110.0, brokers_answer=True)
    assert reason == "no event acknowledged for 10 s while the brokers answer"


def test_a_silence_while_the_brokers_do_not_answer_is_not_the_producer_s_fault() -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    assert watchdog.reason_to_replace(1000.0, brokers_answer=False) is None
    assert watchdog.reset_after_s == 10.0


def test_nothing_to_acknowledge_restarts_the_silence() -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    watchdog.nothing_to_acknowledge(8.0)
    assert watchdog.reason_to_replace(17.0, brokers_answer=True) is None
    assert watchdog.reason_to_replace(18.0, brokers_answer=True) is not None


def test_each_fruitless_reset_doubles_the_wait_up_to_five_minutes() -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    now = 0.0
    waits = []
    for _ in range(8):
        wait = watchdog.reset_after_s
        assert watchdog.reason_to_replace(now + wait - 0.01, brokers_answer=True) is None
        now += wait
        assert watchdog.reason_to_replace(now, brokers_answer=True) is not None
        watchdog.replaced(now)
        waits.append(wait)
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, MAX_RESET_AFTER_S, 300.0, 300.0]


def test_an_acknowledgement_brings_the_wait_back_to_its_setting() -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    assert watchdog.reason_to_replace(10.0, brokers_answer=True) is not None
    watchdog.replaced(10.0)
    assert watchdog.reset_after_s == 20.0
    watchdog.acknowledged(15.0)
    assert watchdog.reset_after_s == 10.0
    assert watchdog.reason_to_replace(25.0, brokers_answer=True) is not None


@pytest.mark.parametrize("brokers_answer", [True, False])
def test_a_fatal_error_replaces_the_producer_at_once(brokers_answer: bool) -> None:
    watchdog = ProducerWatchdog(10.0, now=0.0)
    watchdog.acknowledged(1.0)
    watchdog.fatal = KafkaError(KafkaError._FATAL, "sequence desynchronized", fatal=True)
    reason = watchdog.reason_to_replace(1.0, brokers_answer=brokers_answer)
    assert reason == "fatal producer error: sequence desynchronized"
    assert watchdog.reset_after_s == 10.0  # a fatal error is no sign of a slow cluster
    watchdog.replaced(1.0)
    assert watchdog.fatal is None
    assert watchdog.reason_to_replace(1.0, brokers_answer=brokers_answer) is None
