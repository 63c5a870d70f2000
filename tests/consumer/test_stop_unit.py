"""Consumer.stop() is bounded: a poll thread stuck in a Kafka call is named, not waited on.

librdkafka's calls on the group thread have no timeout of their own (assignment() was
seen never to answer after leader moves and a lost broker). A stand-in Kafka handle
whose close() blocks stands for such a call here; the workers are real processes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from eventspool.consumer import runner
from eventspool.consumer.runner import Consumer, ConsumerError
from eventspool.consumer.settings import ConsumerSettings
from tests.consumer.fake_kafka import FakeConsumer

pytestmark = pytest.mark.timeout(60)


class CloseNeverAnswers(FakeConsumer):
    """Subscribes at once; close() waits until the test releases it."""

    release = threading.Event()

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        pass

    def close(self) -> None:
        self.release.wait()


@pytest.fixture
def stuck_close(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(runner, "KafkaConsumer", CloseNeverAnswers)
    CloseNeverAnswers.release.clear()
    yield
    CloseNeverAnswers.release.set()


def _consumer() -> Consumer:
    return Consumer(
        "g",
        ["t"],
        "tests.consumer.handlers:slow_from_env",
        workers=1,
        bootstrap_servers="127.0.0.1:1",
        settings=ConsumerSettings(shutdown_timeout_s=0.5, lag_interval_s=3600),
    )


@pytest.mark.usefixtures("stuck_close")
def test_stop_raises_naming_the_call_its_poll_thread_is_stuck_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "_STOP_MARGIN_S", 6.0)
    consumer = _consumer()
    consumer.start()
    with pytest.raises(ConsumerError) as raised:
        consumer.stop()
    message = str(raised.value)
    assert "did not stop within 6 s" in message
    assert "runner.py" in message and "kafka.close()" in message


@pytest.mark.usefixtures("stuck_close")
def test_a_stop_that_ends_in_time_returns_the_status() -> None:
    consumer = _consumer()
    consumer.start()
    threading.Timer(1.0, CloseNeverAnswers.release.set).start()
    status = consumer.stop(timeout=20)
    assert status.state == "stopped"


def test_the_signal_handler_takes_no_lock_so_a_second_signal_cannot_deadlock() -> None:
    """A signal handler runs between two bytecodes of the main thread, which may then
    hold the lock of the Event the handler would set: `timeout` sends SIGTERM twice, and
    the second, landing inside the first one's Event.set(), deadlocked `eventspool
    consume`. Here the handler runs with that lock held by its own thread, as it did."""
    consumer = _consumer()
    returned = threading.Event()

    def signalled_inside_event_set() -> None:
        # The lock Event.set() takes (private to threading.Event).
        with consumer._stop_requested._cond:  # type: ignore[attr-defined]
            consumer._on_signal(signal.SIGTERM, None)
        returned.set()

    threading.Thread(target=signalled_inside_event_set, daemon=True).start()
    assert returned.wait(5), "the signal handler waited for a lock its own thread held"
