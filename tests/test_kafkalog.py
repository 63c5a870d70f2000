"""librdkafka's log lines: one per broker and kind per interval, with what to check."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventspool import Spool
from eventspool.broker import find_free_port
from eventspool.kafkalog import LOGGER_NAME, RepeatFilter

REFUSED = (
    "[thrd:127.0.0.1:{port}/bootstrap]: 127.0.0.1:{port}/bootstrap: Connect to "
    "ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms in state CONNECT)"
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(port: int, ms: int = 0, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": LOGGER_NAME,
            "levelno": level,
            "msg": "%s [%s] %s",
            "args": ("FAIL", "rdkafka#producer-1", REFUSED.format(port=port, ms=ms)),
        }
    )


def test_repeats_of_one_kind_from_one_broker_pass_once_per_interval() -> None:
    clock = _Clock()
    repeat = RepeatFilter(30.0, clock)
    first = _record(9092)
    assert repeat.filter(first)
    assert "is a broker running there?" in first.getMessage()
    assert "bootstrap.servers" in first.getMessage()
    assert not any(repeat.filter(_record(9092, ms)) for ms in range(1, 100))
    assert repeat.filter(_record(9093))  # another broker is news
    clock.now = 31.0
    later = _record(9092, 7)
    assert repeat.filter(later)
    assert "99 more like it in the last 30 s" in later.getMessage()


def test_a_debug_line_gets_no_advice() -> None:
    record = _record(9092, level=logging.DEBUG)
    assert RepeatFilter(30.0, _Clock()).filter(record)
    assert "bootstrap.servers" not in record.getMessage()


def test_a_spool_with_no_broker_logs_a_few_lines_not_one_per_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.DEBUG, logger=LOGGER_NAME),
        Spool(tmp_path, f"127.0.0.1:{find_free_port()}") as spool,
    ):
        spool.send("orders", b"x")
        time.sleep(3)
        spool.close(timeout=0)
    lines = [r for r in caplog.records if r.name == LOGGER_NAME and r.levelno >= logging.ERROR]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]
    assert "is a broker running there?" in lines[0].getMessage()


def test_without_logging_configured_a_wrong_address_is_said_once_on_stderr() -> None:
    """Python's last resort prints warnings and errors when the application configured no
    logging; eventspool does not silence it, and the repeats are cut."""
    script = (
        "import sys, tempfile, time\n"
        "from eventspool import Spool\n"
        "with Spool(tempfile.mkdtemp(), sys.argv[1]) as spool:\n"
        "    spool.send('orders', b'x')\n"
        "    time.sleep(3)\n"
        "    spool.close(timeout=0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, f"127.0.0.1:{find_free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Connection refused" in line]
    assert len(lines) == 1, done.stderr
    assert "is a broker running there?" in lines[0]
