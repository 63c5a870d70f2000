"""Request/reply on a 3-broker cluster (librdkafka's mock): calls go on while every leader
moves and a broker goes down with its leaders re-elected; every call gets its own answer."""

from __future__ import annotations

import functools
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path

import pytest

from eventspool import Spool
from eventspool.broker.mock import MockCluster
from eventspool.config import SenderSettings
from eventspool.consumer import Consumer, ConsumerSettings
from eventspool.rpc import Responder, RpcClient, RpcTimeoutError
from tests.consumer.conftest import GROUP_KAFKA, wait_for
from tests.rpc_handlers import upper_tagged

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.timeout(300)]

PARTITIONS = 4
FAST = {"socket.connection.setup.timeout.ms": 3000}


def test_every_call_is_answered_through_leader_moves_and_a_broker_down(
    cluster: MockCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap_servers
    topic = f"rpc-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, PARTITIONS, 3)
    reply_topic = f"replies-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(reply_topic, 1, 3)
    cluster.set_group_initial_rebalance_delay(0)
    group = f"g-{uuid.uuid4().hex[:8]}"
    server = Consumer(
        group,
        [topic],
        Responder(functools.partial(upper_tagged, "s"), bootstrap),
        workers=1,
        bootstrap_servers=bootstrap,
        settings=ConsumerSettings(kafka={**GROUP_KAFKA, **FAST}, commit_every_s=0.5),
    )
    answered: list[tuple[bytes, bytes]] = []
    failures: list[RpcTimeoutError] = []
    stop = threading.Event()
    calls = 0
    with (
        Spool(
            tmp_path / "spool",
            bootstrap,
            sender_settings=SenderSettings(kafka=FAST, metadata_refresh_s=2.0),
        ) as spool,
        # The mock has no CreateTopics: the reply topic is made here.
        RpcClient(spool, bootstrap, reply_topic=reply_topic) as client,
    ):

        def call_continuously() -> None:
            nonlocal calls
            while not stop.is_set():
                batch: list[tuple[bytes, Future[bytes]]] = []
                for _ in range(8):
                    value = f"req-{calls}-{uuid.uuid4().hex[:6]}".encode()
                    batch.append((value, client.call_async(topic, value, key=value, timeout=60)))
                    calls += 1
                for value, future in batch:
                    try:
                        answered.append((value, future.result()))
                    except RpcTimeoutError as exc:
                        failures.append(exc)

        server.start()
        caller = threading.Thread(target=call_continuously)
        try:
            caller.start()
            wait_for(lambda: len(answered) >= 40, 60, "first answers")
            for partition in range(PARTITIONS):
                cluster.set_leader(topic, partition, (partition + 1) % 3 + 1)
            wait_for(lambda: len(answered) >= 80, 60, "answers after the leader move")
            cluster.broker_down(3)  # every partition on it gets a new leader
            for partition in range(PARTITIONS):
                cluster.set_leader(topic, partition, partition % 2 + 1)
            cluster.set_leader(reply_topic, 0, 1)
            cluster.set_coordinator(group, 2)  # so does the group's coordinator
            wait_for(lambda: len(answered) >= 120, 60, "answers with broker 3 down")
            cluster.broker_up(3)
            wait_for(lambda: len(answered) >= 160, 60, "answers after broker 3 is back")
        finally:
            stop.set()
            caller.join(120)
            server.stop()
    assert not failures, f"{len(failures)} calls timed out, the first: {failures[0]}"
    assert len(answered) == calls
    assert all(reply == value.upper() + b"|s" for value, reply in answered)
