"""Ledger files: what the soak counts as acknowledged and handled must be read exactly."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from eventspool.consumer.record import Record
from eventspool.testing.ledger import HandlerLedger, LedgerReader, LedgerWriter


def test_reader_follows_growing_files_and_waits_for_whole_lines(tmp_path: Path) -> None:
    reader = LedgerReader(tmp_path, "*.ids")
    assert reader.poll() == 0
    with LedgerWriter(tmp_path / "a.ids") as writer:
        writer.append("id-1", "orders")
        writer.append("id-2", "@fanout")
    with (tmp_path / "b.ids").open("ab") as partial:
        partial.write(b"id-1 orders\nid-3 ord")
    assert reader.poll() == 3
    assert reader.counts["orders"]["id-1"] == 2
    assert reader.ids("@fanout") == {"id-2"}

    with (tmp_path / "b.ids").open("ab") as rest:
        rest.write(b"ers\n")
    assert reader.poll() == 1
    assert reader.ids("orders") == {"id-1", "id-3"}
    assert set(reader.counts) == {"orders", "@fanout"}
    assert reader.poll() == 0


def test_handler_ledger_writes_one_file_per_process_after_pickling(tmp_path: Path) -> None:
    handler = pickle.loads(pickle.dumps(HandlerLedger(tmp_path, "worker")))
    for offset in range(3):
        handler(Record("orders", 0, offset, None, b"v", None, None, f"id-{offset}"))
    assert (tmp_path / f"worker-{os.getpid()}.ids").read_text().splitlines() == [
        "id-0 orders",
        "id-1 orders",
        "id-2 orders",
    ]
