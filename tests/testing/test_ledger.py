"""Ledger files: what a killed process acknowledged, and what the soak counts as
acknowledged and handled, must be read back exactly."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventspool.consumer.record import Record
from eventspool.testing.ledger import (
    HandlerLedger,
    LedgerFullError,
    LedgerLine,
    LedgerReader,
    LedgerWriter,
    committed_lines,
    read_lines,
)


def test_reader_follows_growing_files_and_reads_only_committed_lines(tmp_path: Path) -> None:
    reader = LedgerReader(tmp_path, "*.ids")
    assert reader.poll() == 0
    with LedgerWriter(tmp_path / "a.ids") as writer:
        writer.append("id-1", "orders")
        writer.append("id-2", "@fanout")
    b = LedgerWriter(tmp_path / "b.ids")
    b.append("id-1", "orders")
    with (tmp_path / "b.ids").open("r+b") as handle:  # a line stored, its commit not yet
        handle.seek(48 + len(b"id-1 orders\n"))
        handle.write(b"id-3 orders\n")
    assert reader.poll() == 3
    assert reader.counts["orders"]["id-1"] == 2
    assert reader.ids("@fanout") == {"id-2"}
    assert committed_lines(tmp_path / "b.ids") == 1

    b.append("id-3", "orders")
    b.close()
    assert reader.poll() == 1
    assert reader.ids("orders") == {"id-1", "id-3"}
    assert set(reader.counts) == {"orders", "@fanout"}
    assert reader.poll() == 0
    assert committed_lines(tmp_path / "missing.ids") == 0


def test_a_reopened_writer_appends_after_what_the_file_holds(tmp_path: Path) -> None:
    with LedgerWriter(tmp_path / "a.ids") as writer:
        writer.append("id-1", "orders")
    with LedgerWriter(tmp_path / "a.ids") as writer:
        assert writer.lines == 1
        writer.append("id-2", "orders")
    reader = LedgerReader(tmp_path, "a.ids")
    assert reader.poll() == 2
    assert reader.ids("orders") == {"id-1", "id-2"}


@pytest.mark.parametrize("count", [1, 2, 7])
def test_a_torn_commit_falls_back_to_the_previous_one(tmp_path: Path, count: int) -> None:
    with LedgerWriter(tmp_path / "a.ids") as writer:
        for n in range(count):
            writer.append(f"id-{n}", "orders")
    with (tmp_path / "a.ids").open("r+b") as handle:
        handle.seek(((count - 1) % 2) * 24 + 3)  # a byte of the slot the last commit went to
        handle.write(b"\xa5")
    assert committed_lines(tmp_path / "a.ids") == count - 1
    reader = LedgerReader(tmp_path, "a.ids")
    reader.poll()
    assert reader.ids("orders") == {f"id-{n}" for n in range(count - 1)}
    assert [line.event_id for line in read_lines(tmp_path / "a.ids")] == [
        f"id-{n}" for n in range(count - 1)
    ]


def test_lines_read_in_order_with_the_value_beside_the_id(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    with LedgerWriter(path) as writer:
        writer.append("id-2", "orders", "7")
        writer.append("id-1", "@fanout")
        writer.append("id-2", "orders", "8")
    assert read_lines(path) == [
        LedgerLine("id-2", "orders", "7"),
        LedgerLine("id-1", "@fanout", ""),
        LedgerLine("id-2", "orders", "8"),
    ]
    reader = LedgerReader(tmp_path, "a.ids")
    assert reader.poll() == 3
    assert reader.counts == {"orders": {"id-2": 2}, "@fanout": {"id-1": 1}}


def test_a_full_ledger_refuses_the_line(tmp_path: Path) -> None:
    with LedgerWriter(tmp_path / "a.ids", capacity=12) as writer:
        writer.append("id-1", "orders")
        with pytest.raises(LedgerFullError):
            writer.append("id-2", "orders")


def test_handler_ledger_writes_one_file_per_process_after_pickling(tmp_path: Path) -> None:
    handler = pickle.loads(pickle.dumps(HandlerLedger(tmp_path, "worker")))
    for offset in range(3):
        handler(Record("orders", 0, offset, None, b"v", None, None, f"id-{offset}"))
    reader = LedgerReader(tmp_path, f"worker-{os.getpid()}.ids")
    assert reader.poll() == 3
    assert reader.ids("orders") == {"id-0", "id-1", "id-2"}


_WRITER = """
import sys
from pathlib import Path
from eventspool.testing.ledger import LedgerWriter
writer = LedgerWriter(Path(sys.argv[1]))
n = 0
while True:
    writer.append(f"{n:036d}", "t")
    n += 1
"""


def test_what_a_sigkilled_writer_committed_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.ids"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, os.fspath(path)])
    try:
        deadline = time.monotonic() + 30
        while committed_lines(path) < 10_000 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    reader = LedgerReader(tmp_path, "a.ids")
    lines = reader.poll()
    assert lines >= 10_000
    assert reader.ids("t") == {f"{n:036d}" for n in range(lines)}
