"""Client processes SIGKILLed with requests in flight on their pipelined connections.

What must hold: the agent frees each dead client's connection (no descriptor or buffer
kept for it), goes on serving everyone else, and every event a killed client had been
answered for reaches Kafka.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.client.sync import Client
from eventspool.verify import consume_event_ids, ledger
from tests.agent import conftest as agent_fixtures
from tests.agent.conftest import AgentFactory
from tests.fault import test_agent_kill
from tests.fault.test_agent_kill import _ClientChild, _reported, _wait_for_progress

# pytest collects fixtures from module attributes by attribute name (see tests/client).
agent_factory = agent_fixtures.agent_factory
short_dir = test_agent_kill.short_dir

pytestmark = [pytest.mark.slow, pytest.mark.fault]

CLIENTS = 3
KILLS = 3
PROGRESS_EVENTS = 500
CLOSE_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 60.0


def _connections(client: Client) -> int:
    """The agent's open binary connections, the asking client's own included."""
    count = client.stats()["connections"]
    assert isinstance(count, int)
    return count


def test_killed_clients_cost_the_agent_nothing_acknowledged(
    broker: LocalBroker,
    agent_factory: AgentFactory,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
) -> None:
    topic = topic_factory(4)
    agent = agent_factory(socket_path=short_dir / "agent.sock")
    agent.start()
    children = [
        _ClientChild(agent.socket_path, topic, tmp_path / f"client-{n}.err", seed=n)
        for n in range(CLIENTS)
    ]
    acknowledged: set[str] = set()
    try:
        with Client(agent.socket_path) as observer:
            for child in children:  # every client connected, so the count below is theirs
                _wait_for_progress([child], PROGRESS_EVENTS)
            for victim in children[:KILLS]:
                before = _connections(observer)
                victim.process.send_signal(signal.SIGKILL)  # mid-stream: requests in flight
                victim.process.wait()
                deadline = time.monotonic() + CLOSE_TIMEOUT_S
                while _connections(observer) >= before:
                    assert time.monotonic() < deadline, "the dead client's connection stayed"
                    time.sleep(0.05)
                survivors = [child for child in children if child.process.poll() is None]
                if survivors:
                    _wait_for_progress(survivors, PROGRESS_EVENTS)  # the others went on
            assert isinstance(observer.send(topic, b"after the kills"), str)
    finally:
        for child in children:
            child.stop()
            acknowledged.update(child.acknowledged())
    assert _reported(children) == len(acknowledged) > PROGRESS_EVENTS * KILLS
    seen = consume_event_ids(
        broker.bootstrap_servers, [topic], acknowledged, timeout=DRAIN_TIMEOUT_S
    )
    counted = ledger(acknowledged, seen)
    assert counted.lost == 0, f"{counted.lost} acknowledged events lost"
