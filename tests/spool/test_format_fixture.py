"""A spool directory written by the pure-Python ring opens and drains with the compiled one.

`fixtures/spool_format1` was written by eventspool before the compiled core existed
(keyed partitions, a pending ring, a drop_oldest ring that wrapped with padding, heads
moved by acknowledgements); `spool_format1.json` lists, per queue, the event ids still
queued in it. The on-disk format is the contract between releases.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from eventspool import Spool
from eventspool.broker import LocalBroker, create_topic
from eventspool.config import FullPolicy, QueueSettings, SpoolSettings
from eventspool.envelope import decode
from eventspool.errors import QueueFileError
from eventspool.verify import consume_event_ids, ledger

FIXTURE = Path(__file__).parent / "fixtures" / "spool_format1"
EXPECTED: dict[str, list[str]] = json.loads(FIXTURE.with_suffix(".json").read_text())
PARTITIONS = {"orders": 3, "logs": 1}


def _settings() -> SpoolSettings:
    small = QueueSettings(capacity_bytes=65536)
    logs = QueueSettings(capacity_bytes=65536, full_policy=FullPolicy.DROP_OLDEST)
    return SpoolSettings(max_event_bytes=1000, queue=small, topics={"logs": logs})


def _copy(tmp_path: Path, rename: dict[str, str]) -> Path:
    """The fixture under `tmp_path`, its topics renamed (the test broker is shared)."""
    directory = tmp_path / "spool"
    shutil.copytree(FIXTURE, directory)
    counts = json.loads((directory / "partitions.json").read_text())
    counts["topics"] = {rename[name]: count for name, count in counts["topics"].items()}
    (directory / "partitions.json").write_text(json.dumps(counts))
    for old, new in rename.items():
        (directory / "topics" / old).rename(directory / "topics" / new)
    return directory


def test_the_fixture_reads_back_every_queued_event_in_order(tmp_path: Path) -> None:
    directory = _copy(tmp_path, {"orders": "orders", "logs": "logs", "pending-topic": "pending"})
    with Spool(directory, settings=_settings()) as spool:
        assert spool.recovery_reports() == {}
        found: dict[str, list[str]] = {}
        for ref in spool.queues():
            name = "pending-topic" if ref.topic == "pending" else ref.topic
            records = ref.ring.read_batch(100_000, 1 << 30)
            found[f"{name}/{ref.partition}"] = [decode(r.payload).event_id for r in records]
    assert found == EXPECTED


def test_a_version_1_directory_opens_as_version_2_without_a_rewrite(tmp_path: Path) -> None:
    """Each ring file is its queue's first segment: the files stay, FORMAT is written."""
    directory = _copy(tmp_path, {"orders": "orders", "logs": "logs", "pending-topic": "pending"})
    files = sorted(p.relative_to(directory) for p in directory.rglob("*.queue"))
    with Spool(directory, settings=_settings()) as spool:
        assert all(ref.ring.segments == 1 for ref in spool.queues())
    assert sorted(p.relative_to(directory) for p in directory.rglob("*.queue")) == files
    assert (directory / "FORMAT").read_text() == "2\n"


def test_a_directory_of_a_later_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("3\n")
    with pytest.raises(QueueFileError, match=r"format version 3.*the release that wrote it"):
        Spool(tmp_path)


@pytest.mark.slow
def test_the_fixture_drains_to_the_broker(broker: LocalBroker, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    rename = {name: f"fixture-{name}-{suffix}" for name in ("orders", "logs", "pending-topic")}
    for name, count in PARTITIONS.items():
        create_topic(broker.bootstrap_servers, rename[name], count)
    directory = _copy(tmp_path, rename)
    with Spool(directory, broker.bootstrap_servers, settings=_settings()) as spool:
        assert spool.flush(60) == 0
    expected = {event_id for ids in EXPECTED.values() for event_id in ids}
    seen = consume_event_ids(broker.bootstrap_servers, list(rename.values()), expected)
    assert ledger(expected, seen).lost == 0
