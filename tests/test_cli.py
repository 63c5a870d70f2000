"""`eventspool spool inspect` on real spool directories."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from eventspool import Spool
from eventspool.cli import main
from eventspool.spool.ring import HEADER_SIZE


def _make_spool(directory: Path) -> None:
    with Spool(directory) as spool:
        for i in range(20):
            spool.send("orders", b"x" * 50, key=f"user-{i}")
        spool.set_partition_count("orders", 2)
        spool.send("clicks", b"pending one")


def test_inspect_lists_every_queue_with_depth_and_positions(tmp_path: Path) -> None:
    _make_spool(tmp_path)
    result = CliRunner().invoke(main, ["spool", "inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "not in use" in result.output
    assert "orders=2" in result.output
    assert "clicks/pending" in result.output
    data = json.loads(
        CliRunner().invoke(main, ["spool", "inspect", str(tmp_path), "--json"]).output
    )
    depths = {(q["topic"], q["partition"]): q["stats"]["depth"] for q in data["queues"]}
    assert depths[("clicks", None)] == 1
    assert depths[("orders", 0)] + depths[("orders", 1)] == 20


def test_inspect_changes_nothing(tmp_path: Path) -> None:
    _make_spool(tmp_path)
    files = sorted(tmp_path.glob("topics/*/*.queue"))
    before = [f.read_bytes() for f in files]
    assert CliRunner().invoke(main, ["spool", "inspect", str(tmp_path)]).exit_code == 0
    assert [f.read_bytes() for f in files] == before


def test_inspect_reports_damage_and_skipped_records(tmp_path: Path) -> None:
    with Spool(tmp_path) as spool:
        spool.set_partition_count("orders", 1)
        for _ in range(10):
            spool.send("orders", b"y" * 100)
    queue = tmp_path / "topics" / "orders" / "0.queue"
    with queue.open("r+b") as handle:
        handle.seek(HEADER_SIZE + 5 * 200)
        handle.write(b"\xff" * 600)
    data = json.loads(
        CliRunner().invoke(main, ["spool", "inspect", str(tmp_path), "--json"]).output
    )
    recovery = data["queues"][0]["recovery"]
    assert recovery["corrupt_tail"] is True
    assert 0 < recovery["skipped_records"] <= 6
    assert data["queues"][0]["stats"]["depth"] == 10 - recovery["skipped_records"]
    table = CliRunner().invoke(main, ["spool", "inspect", str(tmp_path)]).output
    assert "DAMAGED" in table


def test_inspect_names_a_file_with_a_bad_header_and_fails(tmp_path: Path) -> None:
    _make_spool(tmp_path)
    queue = tmp_path / "topics" / "orders" / "0.queue"
    with queue.open("r+b") as handle:
        handle.write(b"NOTSPOOL")
    result = CliRunner().invoke(main, ["spool", "inspect", str(tmp_path)])
    assert result.exit_code == 1
    assert "0.queue" in result.output
    assert "bad magic" in result.output


def test_inspect_of_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["spool", "inspect", str(tmp_path / "nope")])
    assert result.exit_code != 0
    assert "is not a spool directory" in result.output
