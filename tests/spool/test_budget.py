"""The spool's disk budget, on real queue files: what is on disk is what is counted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eventspool.config import DEFAULT_MAX_SPOOL_BYTES, QueueSettings, SpoolSettings
from eventspool.errors import SpoolBudgetError, SpoolFullError
from eventspool.pipeline import Spool

QUEUE = 64 * 1024
RING_FILE = 4096 + QUEUE  # the header page, then the ring


def budget(max_bytes: int | None = None, max_topics: int | None = None) -> SpoolSettings:
    return SpoolSettings(
        max_event_bytes=4096,
        queue=QueueSettings(capacity_bytes=QUEUE),
        max_spool_bytes=max_bytes,
        max_topics=max_topics,
    )


def queue_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*.queue"))


def test_a_new_queue_over_the_budget_is_refused_and_existing_ones_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each topic with no partition count yet takes one (pending) ring file."""
    with Spool(tmp_path, settings=budget(max_bytes=3 * RING_FILE)) as spool:
        for n in range(3):
            spool.send(f"t{n}", b"fits")
        with caplog.at_level(logging.WARNING, "eventspool.spool"):
            for n in range(3, 50):
                with pytest.raises(SpoolBudgetError, match=r"max_spool_bytes"):
                    spool.send(f"t{n}", b"over")
        assert [r for r in caplog.records if "max_spool_bytes" in r.getMessage()], "not logged"
        assert len([r for r in caplog.records if "max_spool_bytes" in r.getMessage()]) == 1
        for _ in range(100):
            spool.send("t0", b"still served")
        use = spool.budget()
        assert (use.used_bytes, use.max_bytes, use.topics, use.refusals) == (
            3 * RING_FILE,
            3 * RING_FILE,
            3,
            47,
        )
        assert spool.unacknowledged() == 103
    assert queue_bytes(tmp_path) == 3 * RING_FILE
    assert not (tmp_path / "topics" / "t3").exists()


def test_the_budget_is_a_kind_of_full_spool(tmp_path: Path) -> None:
    """Code that backs off on SpoolFullError backs off on the budget too."""
    with (
        Spool(tmp_path, settings=budget(max_bytes=RING_FILE)) as spool,
        pytest.raises(SpoolFullError),
    ):
        spool.send("a", b"x")
        spool.send("b", b"x")


def test_max_topics_refuses_a_new_topic_but_not_a_new_partition_of_a_known_one(
    tmp_path: Path,
) -> None:
    with Spool(tmp_path, settings=budget(max_topics=2)) as spool:
        spool.send("a", b"x")
        spool.send("b", b"x")
        with pytest.raises(SpoolBudgetError, match=r"max_topics"):
            spool.send("c", b"x")
        spool.set_partition_count("a", 4)
        for key in range(20):
            spool.send("a", b"x", key=b"%d" % key)
        assert spool.budget().topics == 2


def test_files_already_on_disk_count_from_the_start(tmp_path: Path) -> None:
    with Spool(tmp_path, settings=budget()) as spool:
        for n in range(4):
            spool.send(f"t{n}", b"x")
    with Spool(tmp_path, settings=budget(max_bytes=3 * RING_FILE)) as spool:
        assert spool.budget().used_bytes == 4 * RING_FILE
        spool.send("t1", b"an existing queue goes on")
        with pytest.raises(SpoolBudgetError):
            spool.send("t9", b"x")


def test_moving_pending_events_to_their_partitions_is_never_refused(tmp_path: Path) -> None:
    """They were acknowledged already: the move may go over the budget, and the pending
    file it deletes is given back."""
    with Spool(tmp_path, settings=budget(max_bytes=2 * RING_FILE)) as spool:
        for key in range(40):
            spool.send("orders", b"x", key=b"%d" % key)
        spool.set_partition_count("orders", 4)
        assert spool.unacknowledged() == 40
        assert spool.budget().used_bytes == 4 * RING_FILE == queue_bytes(tmp_path)
        with pytest.raises(SpoolBudgetError):
            spool.send("other", b"x")


def test_the_default_budget_is_on(tmp_path: Path) -> None:
    assert SpoolSettings().max_spool_bytes == DEFAULT_MAX_SPOOL_BYTES
    with Spool(tmp_path) as spool:
        assert spool.budget().max_bytes == DEFAULT_MAX_SPOOL_BYTES


@pytest.mark.parametrize("name", ["max_spool_bytes", "max_topics"])
def test_a_limit_must_be_positive_or_none(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SpoolSettings(**{name: 0})  # type: ignore[arg-type]
