"""The spool's Prometheus figures, read at scrape time from a real spool directory."""

from __future__ import annotations

import re
from pathlib import Path

from eventspool import QueueSettings, Spool, SpoolSettings
from eventspool.config import Durability
from eventspool.metrics import render


def _count(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not exported"
    return float(match.group(1))


def test_each_fdatasync_of_an_fsync_queue_is_timed(tmp_path: Path) -> None:
    """The ring reports its syncs through a callback the spool's assembly passes in: the
    storage layer knows nothing of Prometheus."""
    settings = SpoolSettings(topics={"audit": QueueSettings(durability=Durability.FSYNC)})
    with Spool(tmp_path, settings=settings) as spool:
        before = _count(render(spool).decode(), "eventspool_fsync_seconds_count")
        for i in range(3):
            spool.send("audit", b"kept %d" % i)
        spool.send("other", b"not synced")
        after = _count(render(spool).decode(), "eventspool_fsync_seconds_count")
        depth = re.search(
            r'^eventspool_queue_depth\{partition="pending",topic="audit"\} (\d+)',
            render(spool).decode(),
            re.MULTILINE,
        )
    assert after - before == 3
    assert depth is not None and depth.group(1) == "3"
