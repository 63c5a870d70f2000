"""The log-shipper bench's own logic: events, the syslog format, rsyslog's config, loss attribution.

The last test runs rsyslogd with the rendered config against the real broker: the value a
caller sends must reach Kafka byte for byte, or the bench could not match ids.
"""

from __future__ import annotations

import string
import subprocess
import time
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker, create_topic
from eventspool.verify import consume_event_ids
from harness.ledger import KillLoss, losses_by_kill
from log_shipper import (
    PAYLOAD_BYTES,
    Rsyslogd,
    SyslogSocket,
    bundled_librdkafka,
    event_id,
    find_rsyslogd,
    make_payload,
    record_id,
    render_rsyslog_config,
    syslog_header,
)

PRINTABLE = set((string.ascii_letters + string.digits + string.punctuation + " ").encode())


RSYSLOGD = find_rsyslogd()
needs_rsyslog = pytest.mark.skipif(RSYSLOGD is None, reason="rsyslogd with omkafka missing")


class Record:
    """What `record_id` reads of a consumed record."""

    def __init__(self, value: bytes | None) -> None:
        self._value = value

    def value(self) -> bytes | None:
        return self._value


def test_payload_is_printable_fixed_size_and_carries_its_id() -> None:
    payload = make_payload("t0", 7, 123456)
    assert len(payload) == PAYLOAD_BYTES
    assert set(payload) <= PRINTABLE
    assert record_id(Record(payload)) == event_id("t0", 7, 123456) == "t0-7-123456"


def test_payloads_differ_only_by_id() -> None:
    first, second = make_payload("a", 0, 1), make_payload("a", 0, 2)
    assert first != second
    assert first[len("id=a-0-1 ") :] == second[len("id=a-0-2 ") :]


def test_record_id_rejects_what_is_not_an_event() -> None:
    assert record_id(Record(None)) is None
    assert record_id(Record(b"rsyslogd: [origin software=...] start")) is None
    # rsyslog's msg property starts with the space after "tag:"; the template strips it.
    assert record_id(Record(b" " + make_payload("a", 0, 1))) is None


def test_syslog_header_is_what_glibc_writes() -> None:
    when = time.mktime((2026, 11, 1, 8, 5, 9, 0, 0, -1))
    assert syslog_header(when, 42) == b"<14>Nov  1 08:05:09 bench[42]: "
    later = time.mktime((2026, 11, 21, 18, 45, 0, 0, 0, -1))
    assert syslog_header(later, 7, b"app") == b"<14>Nov 21 18:45:00 app[7]: "


def test_config_has_the_reliability_settings_and_own_paths(tmp_path: Path) -> None:
    config = render_rsyslog_config(tmp_path / 'odd "dir"', "127.0.0.1:1,127.0.0.1:2", "logs")
    for setting in (
        'SysSock.Use="off"',
        'RateLimit.Interval="0"',
        'queue.type="LinkedList"',
        'queue.filename="to_kafka"',
        'queue.saveOnShutdown="on"',
        'action.resumeRetryCount="-1"',
        '"enable.idempotence=true"',
        '"compression.codec=lz4"',
        '"acks=all"',
        'broker=["127.0.0.1:1", "127.0.0.1:2"]',
        'topic="logs"',
    ):
        assert setting in config
    assert 'odd \\"dir\\"/log.sock"' in config
    assert "/dev/log" not in config


@needs_rsyslog
def test_rsyslogd_accepts_the_config(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    config = tmp_path / "rsyslog.conf"
    config.write_text(render_rsyslog_config(tmp_path, "127.0.0.1:9092", "logs"))
    check = subprocess.run(
        [str(RSYSLOGD), "-N1", "-f", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


def test_each_lost_event_is_charged_to_the_next_kill() -> None:
    kills = [10.0, 20.0]
    losses, after_last = losses_by_kill([9.995, 9.9, 15.0, 19.999, 25.0], kills)
    assert losses == [KillLoss(2, 100.0), KillLoss(2, 5000.0)]
    assert after_last == 1
    assert losses_by_kill([], kills) == ([KillLoss(0, 0.0), KillLoss(0, 0.0)], 0)


@needs_rsyslog
def test_rsyslog_ships_the_value_unchanged(broker: LocalBroker, tmp_path: Path) -> None:
    """A syslog(3)-style datagram in, the bare 100-byte value out, through the real broker."""
    topic = f"logship-{time.monotonic_ns()}"
    create_topic(broker.bootstrap_servers, topic, 1)
    library = bundled_librdkafka(tmp_path / "lib")
    rsyslogd = Rsyslogd(str(RSYSLOGD), tmp_path, broker.bootstrap_servers, topic, library)
    sender = SyslogSocket(rsyslogd.socket_path)
    values = [make_payload("u", 0, seq).decode() for seq in range(3)]
    try:
        for value in values:
            sender.send(value.encode())
        seen = consume_event_ids(
            broker.bootstrap_servers,
            [topic],
            values,
            timeout=30,
            id_of=lambda message: message.value().decode(),
            poll_timeout=0.05,
        )
    finally:
        sender.close()
        rsyslogd.stop(60.0)
    assert seen == dict.fromkeys(values, 1)
