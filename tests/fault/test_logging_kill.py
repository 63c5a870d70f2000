"""Log handlers under SIGKILL: of the logging process (`SpoolHandler`), of the agent
(`AgentHandler`).

What must hold: every record whose `emit()` returned reaches Kafka with its fields
intact, as exactly one event (the sender may resend an event it had in flight, under
the same event_id: consumers drop those by id); through the agent, records logged
while it is dead arrive once it is back, in order per key, and logging never raises.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventspool.broker import LocalBroker
from eventspool.logging import AgentHandler
from eventspool.pipeline import Spool
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids, header_event_id
from tests.fault import logging_child, test_agent_kill
from tests.fault.children import LineReader, run_and_kill

# pytest collects fixtures from module attributes by attribute name (see tests/client).
short_dir = test_agent_kill.short_dir

pytestmark = [pytest.mark.slow, pytest.mark.fault]

RecordProperty = Callable[[str, object], None]

RECORDS = 100_000
THREADS = 4
PARTITIONS = 4
LOG_TIMEOUT_S = 240.0
DRAIN_TIMEOUT_S = 120.0


class _Consumed:
    """What `consume_event_ids` read: per record seq its event ids, per partition the seqs."""

    def __init__(self) -> None:
        self.event_ids: dict[int, set[str]] = defaultdict(set)
        self.by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)

    def __call__(self, message: Any) -> str:
        fields = json.loads(message.value())
        seq = int(fields["extra"]["seq"])
        event_id = header_event_id(message)
        assert event_id is not None
        self.event_ids[seq].add(event_id)
        self.by_partition[message.partition()].append(fields)
        return str(seq)


def _first_seqs_per_key(consumed: _Consumed, key: str) -> dict[object, list[int]]:
    """Per key value, the seqs in partition order, each at its first arrival only."""
    seqs: dict[object, list[int]] = defaultdict(list)
    seen: set[int] = set()
    for records in consumed.by_partition.values():
        for fields in records:
            seq = int(fields["extra"]["seq"])
            if seq not in seen:
                seen.add(seq)
                seqs[fields["extra"][key]].append(seq)
    return seqs


def _wait_for_done(reader: LineReader, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while not (reader.lines and reader.lines[-1].startswith("D ")):
        assert process.poll() is None, "the logging child died on its own"
        assert time.monotonic() < deadline, f"not all {RECORDS} records logged in time"
        time.sleep(0.01)
    return reader.lines[-1]


def test_sigkill_after_100k_records_loses_none_whose_emit_returned(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    record_property: RecordProperty,
) -> None:
    """4 threads log 100,000 records through SpoolHandler; the process is SIGKILLed at
    once after the last returned, its sender still shipping; a spool reopened on the
    directory ships the rest, and Kafka holds each record once, every field intact."""
    topic = topic_factory(PARTITIONS)
    directory = tmp_path / "spool"
    report = run_and_kill(
        "tests.fault.logging_child",
        [str(directory), broker.bootstrap_servers, topic, str(THREADS), str(RECORDS)],
        until=_wait_for_done,
    )
    # What the handler reports goes through handleError, as "--- Logging error ---"; the
    # sender's own warnings (a topic of one replica on tansu) may be there too.
    assert "Logging error" not in report.stderr, f"the handler reported errors: {report.stderr}"
    (done,) = report.said
    emitted = {int(line.event_id) for line in report.acknowledged}
    assert emitted == set(range(RECORDS))
    record_property("unacknowledged_at_kill", int(done.split()[1]))

    with Spool(directory, broker.bootstrap_servers) as spool:
        assert spool.flush(timeout=DRAIN_TIMEOUT_S) == 0

    consumed = _Consumed()
    seen = consume_event_ids(
        broker.bootstrap_servers,
        [topic],
        {str(seq) for seq in emitted},
        timeout=DRAIN_TIMEOUT_S,
        id_of=consumed,
        to_end=True,
    )
    missing = emitted - {int(seq) for seq in seen}
    assert not missing, f"{len(missing)} emitted records are not in Kafka: {sorted(missing)[:10]}"
    twice = {seq: ids for seq, ids in consumed.event_ids.items() if len(ids) != 1}
    assert not twice, f"records spooled as more than one event: {list(twice.items())[:5]}"
    record_property("resent_duplicates", sum(seen.values()) - len(seen))

    pids = set()
    for records in consumed.by_partition.values():
        for fields in records:
            extra = fields["extra"]
            seq, worker = extra["seq"], extra["worker"]
            intact = {name: fields[name] for name in ("message", "level", "logger", "extra")}
            assert intact == logging_child.expected(seq, worker), f"record {seq} damaged"
            if seq % logging_child.EXCEPTION_EVERY == 0:
                assert fields["exception"]["type"] == "RuntimeError"
                assert f"failure {seq}" in fields["exception"]["traceback"]
            pids.add(fields["process"])
    assert pids == {report.pid}
    for worker, seqs in _first_seqs_per_key(consumed, "worker").items():
        assert seqs == list(range(int(str(worker)), RECORDS, THREADS)), f"worker {worker} order"


KEYS = 8
RESTARTS = 2
LOG_PAUSE_S = 0.0005
DOWN_S = (0.5, 1.5)
EMIT_BOUND_S = 0.5


class _KeyedLogger(threading.Thread):
    """Logs keyed records as fast as it can until stopped; times the slowest call."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(daemon=True)
        self.logger = logger
        self.logged = 0
        self.slowest_s = 0.0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                seq = self.logged
                started = time.monotonic()
                self.logger.info("keyed %d", seq, extra={"seq": seq, "request_id": seq % KEYS})
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                self.logged += 1
                time.sleep(LOG_PAUSE_S)
        except BaseException as exc:
            self.error = exc


def test_agent_handler_records_logged_while_the_agent_is_dead_arrive_in_key_order(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    short_dir: Path,
    record_property: RecordProperty,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topic = topic_factory(PARTITIONS)
    agent = AgentProcess(short_dir, broker.bootstrap_servers)  # socket: short_dir/agent.sock
    logger = logging.getLogger("fault.agent_handler")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = AgentHandler(
        agent.socket_path, topic, key_attribute="request_id", timeout=2.0, error_interval_s=1.0
    )
    logger.addHandler(handler)
    writer = _KeyedLogger(logger)
    try:
        agent.start_answering()
        writer.start()
        for _ in range(RESTARTS):
            time.sleep(rng.uniform(0.3, 1.0))
            agent.kill()
            before = writer.logged
            time.sleep(rng.uniform(*DOWN_S))
            assert writer.logged > before, f"seed {seed}: logging stalled while the agent was dead"
            agent.start_answering()
        time.sleep(0.5)
        writer.stopping.set()
        writer.join(10)
        handler.flush()
    finally:
        writer.stopping.set()
        logger.removeHandler(handler)
        handler.close()
        agent.stop()
    assert writer.error is None, f"seed {seed}: logging raised {writer.error!r}"
    assert writer.slowest_s < EMIT_BOUND_S, f"seed {seed}: a call took {writer.slowest_s} s"
    assert handler.dropped == 0 and handler.pending == 0
    assert handler.failed_attempts > 0, f"seed {seed}: the kills never reached the handler"
    assert "LogDeliveryError" in capsys.readouterr().err  # reported, not silent
    record_property("records", writer.logged)
    record_property("failed_attempts", handler.failed_attempts)

    consumed = _Consumed()
    seen = consume_event_ids(
        broker.bootstrap_servers,
        [topic],
        {str(seq) for seq in range(writer.logged)},
        timeout=DRAIN_TIMEOUT_S,
        id_of=consumed,
    )
    missing = set(range(writer.logged)) - {int(seq) for seq in seen}
    assert not missing, f"seed {seed}: {len(missing)} records lost: {sorted(missing)[:10]}"
    record_property("duplicates", sum(seen.values()) - len(seen))
    for key, seqs in _first_seqs_per_key(consumed, "request_id").items():
        assert seqs == sorted(seqs), f"seed {seed}: key {key} out of order"
