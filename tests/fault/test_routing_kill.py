"""Fanout to three topics under SIGKILL: every acknowledged event reaches all three.

A publish through a fanout exchange writes the event, with one event_id, to a queue of
each bound topic, and `send()` returns only once all three hold it. A kill can land
between those writes: that call never returned, so the event may be in some topics
only, and nobody was told it was sent. Everything that was acknowledged must be in
every topic once the spool is drained, whether the writer is an in-process Spool
(reopened after each kill, then drained) or the agent (restarted, then drained).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.pipeline import Spool
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids
from tests.fault import test_agent_kill as agent_kill
from tests.fault.children import run_and_kill
from tests.fault.routing_child import EXCHANGE, PARTITIONS

pytestmark = [pytest.mark.slow, pytest.mark.fault]

# pytest finds fixtures by module attribute: this brings the kill test's short socket dir.
short_dir = agent_kill.short_dir

RecordProperty = Callable[[str, object], None]
TOPICS = 3
SPOOL_KILL_CYCLES = 8
CHILD_RATE = 3000  # events per second; each is written three times
AGENT_KILL_CYCLES = 5
AGENT_CLIENTS = 2
CONSUME_TIMEOUT_S = 120.0


def _missing_per_topic(
    bootstrap: str, topics: list[str], expected: set[str]
) -> tuple[dict[str, set[str]], set[str]]:
    """(acknowledged ids missing from each topic, ids found that were never acknowledged)."""
    missing: dict[str, set[str]] = {}
    unreported: set[str] = set()
    for topic in topics:
        seen = consume_event_ids(bootstrap, [topic], expected, timeout=CONSUME_TIMEOUT_S)
        missing[topic] = expected - seen.keys()
        unreported.update(seen.keys() - expected)
    return missing, unreported


def test_fanout_from_a_sigkilled_spool_reaches_every_topic(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    record_property: RecordProperty,
) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topics = [topic_factory(PARTITIONS) for _ in range(TOPICS)]
    directory = tmp_path / "spool"
    reported: list[str] = []
    backlogs: list[int] = []
    for cycle in range(SPOOL_KILL_CYCLES):
        args = [
            os.fspath(directory),
            broker.bootstrap_servers,
            ",".join(topics),
            str(CHILD_RATE),
            str(rng.getrandbits(32)),
        ]
        report = run_and_kill("tests.fault.routing_child", args, rng.uniform(0.2, 1.2))
        assert report.acknowledged, f"seed {seed}, cycle {cycle}: the child published nothing"
        reported.extend(line.event_id for line in report.acknowledged)
        backlogs.append(report.start)

    with Spool(directory, broker.bootstrap_servers) as spool:  # adopted: drained, not routed
        final_backlog = spool.unacknowledged()
        remaining = spool.flush(120)
    record_property("seed", seed)
    record_property("events_acknowledged_by_send", len(reported))
    record_property("backlog_at_each_start", [*backlogs, final_backlog])
    assert remaining == 0, f"seed {seed}: {remaining} events still unacknowledged after 120 s"
    assert sum(backlogs[1:]) + final_backlog > 0, f"seed {seed}: no kill left a backlog"

    expected = set(reported)
    assert len(expected) == len(reported), f"seed {seed}: send() returned an event_id twice"
    missing, unreported = _missing_per_topic(broker.bootstrap_servers, topics, expected)
    record_property("found_but_never_acknowledged", len(unreported))
    assert all(not ids for ids in missing.values()), (
        f"seed {seed}: acknowledged events missing, by topic: "
        f"{ {topic: sorted(ids)[:3] for topic, ids in missing.items() if ids} }"
    )
    # One publisher thread: a kill interrupts at most one send, whose event may be in
    # some topics (a kill between the writes to the three queues) or in all of them.
    assert len(unreported) <= SPOOL_KILL_CYCLES, f"seed {seed}: {len(unreported)} unreported"


def test_fanout_through_a_sigkilled_agent_reaches_every_topic(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
    record_property: RecordProperty,
) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topics = [topic_factory(PARTITIONS) for _ in range(TOPICS)]
    bindings = ", ".join(f'{{ topic = "{topic}" }}' for topic in topics)
    agent = AgentProcess(
        tmp_path,
        broker.bootstrap_servers,
        f'[exchanges.{EXCHANGE}]\ntype = "fanout"\nbindings = [{bindings}]\n',
        socket_path=short_dir / "agent.sock",
    )
    children: list[agent_kill._ClientChild] = []
    try:
        try:
            agent.start_answering(agent_kill.START_TIMEOUT_S)
            children = [
                agent_kill._ClientChild(
                    agent.socket_path,
                    f"@{EXCHANGE}",
                    tmp_path / f"client-{n}.stderr",
                    rng.getrandbits(32),
                )
                for n in range(AGENT_CLIENTS)
            ]
            for _ in range(AGENT_KILL_CYCLES):
                agent_kill._wait_for_progress(children, agent_kill.PROGRESS_EVENTS)
                time.sleep(rng.uniform(*agent_kill.KILL_DELAY_S))
                agent.kill()
                agent.start_answering(agent_kill.START_TIMEOUT_S)
            agent_kill._wait_for_progress(children, agent_kill.PROGRESS_EVENTS)
            for child in children:
                child.check_alive()
        finally:
            for child in children:
                child.stop()
        agent.wait_until_drained(agent_kill.DRAIN_TIMEOUT_S)
    finally:
        agent.stop()

    reported = [event_id for child in children for event_id in child.acknowledged()]
    expected = set(reported)
    record_property("seed", seed)
    record_property("events_acknowledged_by_send", len(reported))
    record_property("sends_failed_by_a_kill", sum(child.failed_sends() for child in children))
    assert len(expected) == len(reported), f"seed {seed}: send() returned an event id twice"
    missing, unreported = _missing_per_topic(broker.bootstrap_servers, topics, expected)
    record_property("found_but_never_acknowledged", len(unreported))
    assert all(not ids for ids in missing.values()), (
        f"seed {seed}: acknowledged events missing, by topic: "
        f"{ {topic: sorted(ids)[:3] for topic, ids in missing.items() if ids} }"
    )
