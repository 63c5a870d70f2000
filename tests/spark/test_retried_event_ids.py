"""A publisher SIGKILLed mid-fanout replays from its checkpoint with the same event ids:
`eventspool.verify` counts the copies as duplicates of known events, and the Spark raw
archive holds each event once.

Without caller-chosen ids the replayed copies would carry new ids, and nothing
downstream could tell them from new events.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.verify import consume_event_ids, ledger
from tests.fault.children import run_and_kill
from tests.fault.retry_child import event_id_of
from tests.spark.conftest import SPARK_COMMAND_MARKS, command_failure
from tests.spark.pipeline_data import RULES_TOML, archive_ids, pipeline_command

pytestmark = [*SPARK_COMMAND_MARKS, pytest.mark.fault]

RecordProperty = Callable[[str, object], None]
EVENTS = 3_000
RATE = 3_000  # events per second, each written to both topics
KILLS = 2
CHECKPOINT_EVERY = 200  # the publisher replays from its last multiple of this
MASTER = "local[2]"
DELIVERY_TIMEOUT_S = 180.0


def _publish(
    directory: Path,
    bootstrap: str,
    topics: list[str],
    seed: int,
    start: int,
    *,
    kill_after_s: float | None,
) -> list[int]:
    """Run the publisher from `start`; kill it after `kill_after_s`, or once all is
    delivered when None. The indexes whose publish returned."""
    args = [os.fspath(directory), bootstrap, ",".join(topics), str(seed), str(start)]
    args += [str(EVENTS), str(RATE)]
    if kill_after_s is not None:
        report = run_and_kill("tests.fault.retry_child", args, kill_after_s)
    else:
        report = run_and_kill(
            "tests.fault.retry_child",
            args,
            until=lambda reader, child: _wait_for_done(reader.lines, child),
        )
        assert report.said[-1] == "D 0", f"not all delivered: {report.said[-1]}"
    index_of = {event_id_of(seed, index): index for index in range(start, EVENTS)}
    return [index_of[line.event_id] for line in report.acknowledged]


def _wait_for_done(lines: list[str], child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while not (lines and lines[-1].startswith("D ")):
        assert child.poll() is None, "the publisher died on its own"
        assert time.monotonic() < deadline, "the publisher did not finish in time"
        time.sleep(0.1)


def test_replayed_events_are_deduplicated_by_verify_and_the_raw_archive(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    database: str,
    tmp_path: Path,
    record_property: RecordProperty,
) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topics = [topic_factory(2), topic_factory(2)]
    directory = tmp_path / "spool"
    start = 0
    replayed = 0
    for _ in range(KILLS):
        acknowledged = _publish(
            directory,
            broker.bootstrap_servers,
            topics,
            seed,
            start,
            kill_after_s=rng.uniform(0.2, 0.6),
        )
        assert acknowledged, f"seed {seed}: the publisher acknowledged nothing before its kill"
        done = acknowledged[-1] + 1
        checkpoint = done - done % CHECKPOINT_EVERY
        replayed += done - max(start, checkpoint)
        start = max(start, checkpoint)
    _publish(directory, broker.bootstrap_servers, topics, seed, start, kill_after_s=None)
    record_property("seed", seed)
    record_property("events_replayed", replayed)

    expected = [event_id_of(seed, index) for index in range(EVENTS)]
    for topic in topics:
        seen = consume_event_ids(broker.bootstrap_servers, [topic], expected, to_end=True)
        found = ledger(expected, seen)
        assert found.lost == 0, f"seed {seed}: {topic} lost {found.lost}"
        assert set(seen) == set(expected), f"seed {seed}: {topic} holds ids never sent"
        # Each replayed event is a copy under its first id; the sender's own resends of
        # its in-flight window after each kill add more copies, also under known ids.
        assert found.duplicated >= replayed, f"seed {seed}: {found}, {replayed} replayed"

    rules = tmp_path / "rules.toml"
    rules.write_text(RULES_TOML)
    out = tmp_path / "out"
    command = pipeline_command(
        broker.bootstrap_servers, topics[:1], out, database, rules, MASTER, EVENTS
    )
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, command_failure(run.stderr)
    archived = archive_ids(out)
    assert sorted(archived) == sorted(expected), f"seed {seed}: the archive is not deduplicated"
    assert f"archive: {EVENTS} rows, {EVENTS} distinct event ids" in run.stdout
