"""The verifier reads back what reached Kafka; what it misses, a ledger would report as lost."""

from __future__ import annotations

from collections.abc import Callable

from eventspool.broker import LocalBroker
from eventspool.verify import consume_event_ids, ledger
from tests.consumer.conftest import produce


def test_to_end_counts_what_lies_behind_the_last_expected_event(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Records after the expected ones (duplicates, unacknowledged events) count too,
    also on tansu, whose high watermark is the base offset of the last batch + 1."""
    topic = topic_factory(2)
    first = produce(broker.bootstrap_servers, topic, [b"first"], partition=0)
    # More than one consume() call returns: a reader that stops once `first` is seen
    # leaves most of these unread.
    later = produce(broker.bootstrap_servers, topic, [b"later"] * 15_000, partition=0)
    other = produce(broker.bootstrap_servers, topic, [b"other"] * 300, partition=1)

    seen = consume_event_ids(broker.bootstrap_servers, [topic], first, to_end=True)

    assert set(seen) == {*first, *later, *other}
    assert ledger(first, seen).lost == 0
