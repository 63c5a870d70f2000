"""`eventspool pipeline run --once --local-db`: a newcomer's run in one command, with a
throwaway PostgreSQL server started and removed by the command itself."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from click.testing import CliRunner

from eventspool.broker import LocalBroker
from eventspool.cli import main
from tests.spark.conftest import SPARK_COMMAND_MARKS, command_failure
from tests.spark.pipeline_data import RULES_TOML, archive_ids, pipeline_command, send_events

pytestmark = SPARK_COMMAND_MARKS

EVENTS = 300


def test_a_run_with_a_throwaway_database_archives_every_event(
    broker: LocalBroker, tmp_path: Path
) -> None:
    stem = f"local-db-{uuid.uuid4().hex[:8]}"
    names = {name: f"{stem}-{name}" for name in ("orders", "payments", "page_views")}
    ids = send_events(tmp_path / "spool", broker.bootstrap_servers, names, EVENTS, seed=3)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES_TOML)
    out = tmp_path / "out"
    command = pipeline_command(
        broker.bootstrap_servers, sorted(names.values()), out, "unused", rules, "local[2]", 1000
    )
    at = command.index("--dsn")
    command[at : at + 2] = ["--local-db"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, command_failure(done.stderr)
    assert "a throwaway PostgreSQL for this run" in done.stderr
    assert set(archive_ids(out)) == set(ids)


def test_dsn_and_local_db_are_one_or_the_other(tmp_path: Path) -> None:
    base = [
        *("pipeline", "run", "--once", "--bootstrap-servers", "127.0.0.1:1"),
        *("--topic", "t", "--output", str(tmp_path)),
    ]
    for extra in ([], ["--dsn", "host=db", "--local-db"]):
        result = CliRunner().invoke(main, [*base, *extra], env={"EVENTSPOOL_PG_DSN": None})
        assert result.exit_code == 2, result.output
        assert "give --dsn (or EVENTSPOOL_PG_DSN) or --local-db" in result.output
