"""Which topic settings can lose an event the broker acknowledged: the rule alone, then
the sender reading them from real brokers (tansu; the 3-broker mock cluster)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.broker import LocalBroker
from eventspool.broker.mock import MockCluster
from eventspool.pipeline import Spool
from eventspool.sender.topicsettings import durability_problems


def test_the_no_data_loss_recipe_has_no_problem() -> None:
    safe = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
    assert durability_problems(3, safe) == []


def test_each_missing_part_of_the_recipe_is_named() -> None:
    (replication,) = durability_problems(1, {"min.insync.replicas": "2"})
    assert "replication factor 1" in replication
    (insync,) = durability_problems(3, {"min.insync.replicas": "1"})
    assert "min.insync.replicas=1" in insync
    (unclean,) = durability_problems(3, {"unclean.leader.election.enable": "true"})
    assert "unclean.leader.election.enable" in unclean


@given(st.integers(1, 5), st.integers(1, 5), st.booleans())
def test_a_problem_is_reported_exactly_when_a_setting_falls_short(
    replication: int, insync: int, unclean: bool
) -> None:
    configs = {"min.insync.replicas": str(insync), "unclean.leader.election.enable": str(unclean)}
    problems = durability_problems(replication, configs)
    assert len(problems) == (replication < 3) + (insync < 2) + unclean
    assert durability_problems(replication, None) == problems[: replication < 3]


def _warnings_of(spool: Spool, topic: str) -> list[str]:
    assert spool.sender is not None
    deadline = time.monotonic() + 15
    while topic not in spool.sender.topic_warnings and time.monotonic() < deadline:
        time.sleep(0.1)
    return spool.sender.topic_warnings.get(topic, [])


def test_a_topic_of_one_replica_is_warned_about_once(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = topic_factory(2)
    with (
        caplog.at_level(logging.WARNING, logger="eventspool.sender.topicsettings"),
        Spool(tmp_path, broker.bootstrap_servers) as spool,
    ):
        spool.send(topic, b"x")
        assert spool.flush(30) == 0
        (problem,) = _warnings_of(spool, topic)
    assert "replication factor 1" in problem
    assert caplog.text.count(f"topic {topic} may lose") == 1
    # tansu answers DescribeConfigs with nothing: said once, not per topic.
    assert caplog.text.count("do not describe topic settings") == 1


def test_a_replicated_topic_gets_no_warning(
    cluster: MockCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"safe-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 3, 3)
    with (
        caplog.at_level(logging.WARNING, logger="eventspool.sender.topicsettings"),
        Spool(tmp_path, cluster.bootstrap_servers) as spool,
    ):
        spool.send(topic, b"x")
        assert spool.flush(30) == 0
        deadline = time.monotonic() + 15
        while "do not describe" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spool.sender is not None
        assert spool.sender.topic_warnings == {}
    assert "do not describe topic settings" in caplog.text
