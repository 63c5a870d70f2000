"""The acknowledgement log of the SIGKILL bench: what a killed child recorded is read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import _acklog
from _acklog import ID_BYTES, AckLog, AckLogFullError
from eventspool.envelope import EventIdGenerator

BENCH_DIR = Path(_acklog.__file__).resolve().parent


def _ids(count: int) -> list[str]:
    generator = EventIdGenerator()
    return [generator.next_id() for _ in range(count)]


def test_a_fresh_log_holds_nothing(tmp_path: Path) -> None:
    log = AckLog(tmp_path / "acks", 10)
    assert log.count() == 0
    assert log.ids() == []


def test_ids_read_back_in_order_from_another_mapping(tmp_path: Path) -> None:
    ids = _ids(5)
    writer = AckLog(tmp_path / "acks", 10)
    for event_id in ids:
        writer.append(event_id)
    reader = AckLog(tmp_path / "acks", 10)
    assert reader.count() == 5
    assert reader.ids() == ids


@pytest.mark.parametrize("count", [1, 2, 7])
def test_a_torn_count_slot_falls_back_to_the_previous_count(tmp_path: Path, count: int) -> None:
    ids = _ids(count)
    log = AckLog(tmp_path / "acks", 10)
    for event_id in ids:
        log.append(event_id)
    with (tmp_path / "acks").open("r+b") as handle:
        handle.seek((count % 2) * 16 + 3)  # a byte inside the slot the last count went to
        handle.write(b"\xa5")
    reader = AckLog(tmp_path / "acks", 10)
    assert reader.count() == count - 1
    assert reader.ids() == ids[:-1]


def test_a_full_log_and_a_malformed_id_are_refused(tmp_path: Path) -> None:
    log = AckLog(tmp_path / "acks", 1)
    with pytest.raises(ValueError, match="36 bytes"):
        log.append("short")
    log.append(_ids(1)[0])
    with pytest.raises(AckLogFullError):
        log.append(_ids(1)[0])


_CHILD = """
import sys
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from _acklog import AckLog
log = AckLog(Path(sys.argv[1]), 10_000_000)
n = 0
while True:
    log.append(f"{n:036d}")
    n += 1
"""


def test_what_a_sigkilled_writer_committed_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "acks"
    log = AckLog(path, 10_000_000)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, os.fspath(path), os.fspath(BENCH_DIR)])
    try:
        deadline = time.monotonic() + 30
        while log.count() < 10_000 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    ids = log.ids()
    assert len(ids) >= 10_000
    assert ids == [f"{n:036d}" for n in range(len(ids))]
    assert all(len(event_id) == ID_BYTES for event_id in ids)
