"""SIGKILL of the Spark driver in the middle of ``eventspool pipeline run --once``, then a
restart from the checkpoint: every event is still archived exactly once and the
statistics and rewards are unchanged (nothing counted twice, nothing lost)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from tests.spark.conftest import SPARK_COMMAND_MARKS, command_failure
from tests.spark.pipeline_data import (
    RULES_TOML,
    archive_ids,
    expected,
    parquet_rewards,
    pipeline_command,
    send_events,
    table_rewards,
    table_stats,
)

pytestmark = [*SPARK_COMMAND_MARKS, pytest.mark.fault]

EVENTS = 3_000
PER_BATCH = 1_000
# Local mode keeps the two Spark starts short; the other Spark tests use a local cluster.
MASTER = "local[2]"


def test_sigkill_of_the_driver_mid_run_then_restart(
    broker: LocalBroker, database: str, tmp_path: Path
) -> None:
    stem = f"kill-{uuid.uuid4().hex[:8]}"
    names = {name: f"{stem}-{name}" for name in ("orders", "payments", "page_views")}
    ids = send_events(tmp_path / "spool", broker.bootstrap_servers, names, EVENTS, seed=5)
    topics = sorted(names.values())
    want = expected(broker.bootstrap_servers, topics, EVENTS)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES_TOML)
    out = tmp_path / "out"
    command = pipeline_command(
        broker.bootstrap_servers, topics, out, database, rules, MASTER, PER_BATCH
    )
    commits = out / "_checkpoint" / "commits"

    with (tmp_path / "first.log").open("wb") as log:
        # Its own process group: the driver's JVM and executors die with it.
        first = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while not (commits / "0").exists():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no batch committed in time"
            time.sleep(0.05)
        time.sleep(random.uniform(0.0, 1.5))
        assert first.poll() is None, "the run ended before it could be killed"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    committed_at_kill = len([p for p in commits.iterdir() if p.name.isdigit()])
    assert 1 <= committed_at_kill < EVENTS // PER_BATCH

    second = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert second.returncode == 0, command_failure(second.stderr)
    archived = archive_ids(out)
    assert len(archived) == EVENTS
    assert set(archived) == set(ids) == want.event_ids
    assert table_stats(database) == want.stats
    assert table_rewards(database) == want.rewards
    assert parquet_rewards(out) == want.rewards
    assert f"archive: {EVENTS} rows, {EVENTS} distinct event ids" in second.stdout
