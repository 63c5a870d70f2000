"""The agent on a 3-broker cluster (librdkafka's mock), as a process of its own, fed by
client processes: leader moves, a broker down with its leaders re-elected, injected
produce errors, a fatal producer error and a SIGKILL of the agent mid-failover. Nothing
whose `send()` returned may be lost; a queue that cannot drain makes /healthz say so.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from eventspool.broker.mock import ONE_REQUEST_IN_FLIGHT, ApiKey, MockCluster
from eventspool.client.sync import Client
from eventspool.spool.partitioner import partition_for_key
from eventspool.status import render_status
from eventspool.testing.agent import AgentProcess, UnixHTTPConnection
from eventspool.verify import consume_event_ids, ledger
from tests.fault.test_agent_kill import _ClientChild, _reported, _wait_for_progress

pytestmark = [pytest.mark.slow, pytest.mark.fault]

PARTITIONS = 6
CLIENTS = 3
PROGRESS_EVENTS = 300
START_TIMEOUT_S = 20.0
# Fast reactions, so the scenario runs in seconds; the defaults are documented in
# docs/semantics.md.
SENDER_KEYS = """
producer_reset_after_s = 1.0
partition_stuck_s = 2.0
keyless_failover_s = 2.0
stall_after_s = 2.0
metadata_refresh_s = 2.0
"""
LIBRDKAFKA = {"socket.connection.setup.timeout.ms": 3000}


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short directory for the socket: a unix socket path has at most 107 bytes."""
    yield tmp_path_factory.mktemp("ag")


def _agent(
    tmp_path: Path,
    socket_dir: Path,
    cluster: MockCluster,
    librdkafka: Mapping[str, int] = LIBRDKAFKA,
) -> AgentProcess:
    agent = AgentProcess(tmp_path, cluster.bootstrap_servers, socket_path=socket_dir / "a.sock")
    text = agent.config.read_text()
    table = "[kafka.config]\n" + "".join(
        f'"{key}" = {value}\n' for key, value in librdkafka.items()
    )
    agent.config.write_text(
        text.replace("[kafka]\n", "[kafka]\n" + SENDER_KEYS, 1).replace(
            "[spool]\n", table + "[spool]\n", 1
        )
    )
    return agent


def _health(agent: AgentProcess) -> tuple[int, dict[str, object]]:
    connection = UnixHTTPConnection(agent.socket_path, timeout=10)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_agent_loses_nothing_through_leader_moves_broker_loss_fatal_error_and_a_kill(
    cluster: MockCluster, tmp_path: Path, short_dir: Path
) -> None:
    rng = random.Random()
    topic = f"agent-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    # It injects produce errors (the mock's limits: eventspool.broker.mock).
    agent = _agent(tmp_path, short_dir, cluster, {**LIBRDKAFKA, **ONE_REQUEST_IN_FLIGHT})
    children: list[_ClientChild] = []
    try:
        agent.start_answering(START_TIMEOUT_S)
        children = [
            _ClientChild(agent.socket_path, topic, tmp_path / f"c{n}.err", rng.getrandbits(32))
            for n in range(CLIENTS)
        ]
        try:
            _wait_for_progress(children, PROGRESS_EVENTS)
            for partition in range(PARTITIONS):  # every leader moves
                cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
            cluster.push_request_errors(
                ApiKey.PRODUCE,
                [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_ENOUGH_REPLICAS] * 3,
            )
            _wait_for_progress(children, PROGRESS_EVENTS)
            cluster.broker_down(3)  # its partitions get new leaders, as a controller would
            for partition in range(PARTITIONS):
                cluster.set_leader(topic, partition, partition % 2 + 1)
            agent.kill()  # mid-failover
            agent.start_answering(START_TIMEOUT_S)
            _wait_for_progress(children, PROGRESS_EVENTS)
            cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER])
            time.sleep(4)
            cluster.broker_up(3)
            _wait_for_progress(children, PROGRESS_EVENTS)
        finally:
            for child in children:
                child.stop()
        agent.wait_until_drained(30)
        stats = agent.stats()
    finally:
        agent.stop()
    assert stats["sender"]["producer_resets"] >= 1
    reported = [event_id for child in children for event_id in child.acknowledged()]
    assert _reported(children) == len(reported) > 3 * PROGRESS_EVENTS
    result = ledger(reported, consume_event_ids(cluster.bootstrap_servers, [topic], reported))
    assert result.lost == 0, result


def test_healthz_says_stalled_with_its_reason_while_a_queue_cannot_drain(
    cluster: MockCluster, tmp_path: Path, short_dir: Path
) -> None:
    topic = f"stall-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    cluster.set_leader(topic, 0, None)
    key = next(k for i in range(999) if partition_for_key(k := b"k%d" % i, PARTITIONS) == 0)
    agent = _agent(tmp_path, short_dir, cluster)
    try:
        agent.start_answering(START_TIMEOUT_S)
        assert _health(agent)[0] == 200
        with Client(agent.socket_path) as client:
            client.send(topic, b"waits", key)
        deadline = time.monotonic() + 15
        while (answer := _health(agent))[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, body = answer
        assert status == 503
        assert body["status"] == "stalled"
        assert "have not advanced" in str(body["reason"])
        assert body["stalled"] == [
            {"topic": topic, "partition": 0, "depth": 1, "stalled_s": pytest.approx(4, abs=4)}
        ]
        assert "STALLED" in _status_text(agent)
        cluster.set_leader(topic, 0, 2)
        agent.wait_until_drained(30)
        assert _health(agent)[0] == 200
    finally:
        agent.stop()


def _status_text(agent: AgentProcess) -> str:
    stats = agent.stats()
    return render_status(stats, stats, 1.0)
