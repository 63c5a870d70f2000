"""The spool's Prometheus figures, read at scrape time from a real spool directory."""

from __future__ import annotations

import re
import time
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


def test_each_queue_shows_the_disk_its_segments_take(tmp_path: Path) -> None:
    """At rest one segment; under a backlog more (and spares made in the background,
    counted once they are done), and the bytes are what the disk holds."""
    queue = QueueSettings(capacity_bytes=1 << 20, segment_bytes=1 << 16)
    with Spool(tmp_path, settings=SpoolSettings(max_event_bytes=1000, queue=queue)) as spool:
        spool.set_partition_count("burst", 1)
        for _ in range(150):  # about 66 to a segment
            spool.send("burst", b"x" * 900)
        labels = r'\{partition="0",topic="burst"\}'
        deadline = time.monotonic() + 10
        while True:
            text = render(spool).decode()
            files = [p for p in (tmp_path / "topics").rglob("*") if p.is_file()]
            on_disk = sum(p.stat().st_blocks * 512 for p in files)
            if _count(text, f"eventspool_queue_file_bytes{labels}") == on_disk:
                break
            assert time.monotonic() < deadline, "the figures never matched the disk"
            time.sleep(0.01)
    assert _count(text, f"eventspool_queue_segments{labels}") == 3
    assert _count(text, "eventspool_spool_file_bytes") == on_disk
