"""The `eventspool status` table."""

from __future__ import annotations

from typing import Any

from eventspool.status import render_status


def _queue(**changes: Any) -> dict[str, Any]:
    queue = {
        "topic": "orders",
        "partition": 0,
        "depth": 5,
        "oldest_age_ms": 1500,
        "next_seq": 10,
        "head_seq": 5,
        "dropped": 0,
        "skipped_total": 0,
        "segments": 1,
        "allocated_bytes": 4 * 1024 * 1024 + 4096,
    }
    return {**queue, **changes}


def test_each_queue_shows_its_files_on_disk() -> None:
    before = {"queues": [_queue()]}
    after = {"queues": [_queue(segments=3, allocated_bytes=12 * 1024 * 1024)]}
    table = render_status(before, after, 1.0)
    assert "FILES" in table.splitlines()[1]
    assert "12.0 MiB in 3 segments" in table
    assert "4.0 MiB in 1 segment\n" in render_status(before, before, 1.0) + "\n"
