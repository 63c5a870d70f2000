"""Routing against the real embedded broker: what each Kafka topic holds after routing.

Each topic has one partition and gets a final event sent to it directly; once that one
is consumed, everything routed to the topic before it has been too, so the tests can
say what a topic does not hold as well as what it does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from eventspool.broker import LocalBroker
from eventspool.pipeline import Spool
from eventspool.routing import Binding, Exchange, ExchangeCounts, ExchangeType
from eventspool.verify import consume_topic
from tests.routing.tutorial import TUTORIAL


def tutorial_exchange(topics: dict[str, str]) -> Exchange:
    return Exchange(
        "animals",
        ExchangeType.TOPIC,
        (
            Binding(topics["Q1"], "*.orange.*"),
            Binding(topics["Q2"], "*.*.rabbit"),
            Binding(topics["Q2"], "lazy.#"),
        ),
        alternate_topic=topics["unroutable"],
    )


def where_each_went(
    bootstrap: str, topics: dict[str, str], ids: dict[str, str], last: dict[str, str]
) -> dict[str, Counter[str]]:
    """routing key -> how often its event is in each queue (by the tutorial's names)."""
    found: dict[str, Counter[str]] = {key: Counter() for key in ids}
    for queue, topic in topics.items():
        seen = consume_topic(bootstrap, topic, last[queue])
        for key, event_id in ids.items():
            if seen[event_id]:
                found[key][queue] = seen[event_id]
    return found


def test_the_tutorial_on_the_broker(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topics = {queue: topic_factory(1) for queue in ("Q1", "Q2", "unroutable")}
    exchange = tutorial_exchange(topics)
    with Spool(tmp_path, broker.bootstrap_servers, exchanges=[exchange]) as spool:
        ids = {
            key: spool.send(None, key.encode(), exchange="animals", routing_key=key)
            for key in TUTORIAL
        }
        last = {queue: spool.send(topic, b"last") for queue, topic in topics.items()}
        assert spool.flush(60) == 0
        counts = spool.exchange("animals").counts
    assert counts == ExchangeCounts(routed=6, alternate=3, refused=0)
    found = where_each_went(broker.bootstrap_servers, topics, ids, last)
    assert found == {key: Counter(dict.fromkeys(queues, 1)) for key, queues in TUTORIAL.items()}
