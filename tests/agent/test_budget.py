"""A local client that makes up 10,000 topic names cannot fill the host's disk."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path

from confluent_kafka.admin import AdminClient

from eventspool.broker import LocalBroker
from eventspool.client.sync import Client
from eventspool.errors import SpoolBudgetError
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids, ledger
from tests.agent.conftest import call
from tests.consumer.conftest import wait_for

QUEUE = 64 * 1024
RING_FILE = 4096 + QUEUE
BUDGET = 12 * RING_FILE


def test_ten_thousand_made_up_topics_stay_within_the_budget_and_lose_nothing_allowed(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    """The allowed topic is served before, during and after; each made-up name past the
    budget is refused with its own status and leaves nothing behind, on disk or in Kafka."""
    allowed = topic_factory(2)
    agent = AgentProcess(
        tmp_path,
        broker.bootstrap_servers,
        max_event_bytes=4096,
        spool_keys=f"queue_bytes = {QUEUE}\nmax_spool_bytes = {BUDGET}\n",
    )
    agent.start()
    try:
        with Client(agent.socket_path) as client:
            ids = [client.send(allowed, b"before %d" % n, key=b"%d" % n) for n in range(20)]
            wait_for(
                lambda: {q["partition"] for q in client.stats()["queues"]} == {0, 1},
                30,
                "the allowed topic's partition rings (its pending events moved)",
            )
            made_up: list[Future[str]] = []
            for n in range(10_000):
                made_up.append(client.send_async(f"made-up-{n}", b"x"))
                if n % 100 == 0:
                    ids.append(client.send(allowed, b"during %d" % n))
            assert not wait(made_up, timeout=120).not_done
            refused = [f.exception() for f in made_up if f.exception() is not None]
            ids.append(client.send(allowed, b"after"))
            status, body = call(agent, "POST", "/v1/topics/one-more-made-up", {"value": "x"})
            stats = client.stats()
        spool_bytes = sum(p.stat().st_size for p in (tmp_path / "spool").rglob("*.queue"))
    finally:
        agent.stop()
    assert len(refused) > 9_900
    assert all(isinstance(error, SpoolBudgetError) for error in refused), refused[:3]
    assert "max_spool_bytes" in str(refused[0])
    assert status == 507, body
    assert spool_bytes <= BUDGET
    assert stats["budget"]["used_bytes"] == spool_bytes
    assert stats["budget"]["refusals"] == len(refused) + 1
    seen = consume_event_ids(broker.bootstrap_servers, [allowed], ids, timeout=60)
    assert ledger(ids, seen).lost == 0
    log = agent.log_tail()
    assert log.count("max_spool_bytes") == 1, "one warning per minute, not one per event"
    in_kafka = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    accepted = {f"made-up-{n}" for n, future in enumerate(made_up) if not future.exception()}
    assert {name for name in in_kafka.topics if name.startswith("made-up-")} <= accepted, (
        "a refused topic was asked for (and created) in Kafka"
    )
