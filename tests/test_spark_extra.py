"""Without the `spark` extra (PySpark, PyArrow, psycopg), eventspool still sends, serves
and consumes, and whatever needs Spark says how to install it.

Each check runs in a fresh interpreter whose sys.modules blocks the extra's packages, as
if they were not installed, while everything else comes from this environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from eventspool.spark.extra import INSTALL_COMMAND, MODULES

# Put before each script: the extra's packages then fail to import, as when absent.
_BLOCK_EXTRA = f"import sys\nfor name in {MODULES!r}:\n    sys.modules[name] = None\n"

# The modules of eventspool.spark that use the extra, each a way in for a user.
SPARK_MODULES = (
    "eventspool.spark.session",
    "eventspool.spark.source",
    "eventspool.spark.kafka",
    "eventspool.spark.postgres",
    "eventspool.spark.pgserver",
    "eventspool.spark.jobs.runner",
    "eventspool.spark.jobs.rules",
)


def _run_without_extra(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _BLOCK_EXTRA + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_sending_serving_and_consuming_need_no_spark() -> None:
    loaded = _run_without_extra(
        """
        import eventspool.agent.service, eventspool.cli, eventspool.client, eventspool.consumer
        from eventspool import Spool
        print(sorted(name for name in sys.modules if name.startswith("eventspool.spark.")))
        """
    )
    # The command line loads only its `pipeline` command group, which imports Spark lazily.
    assert loaded.strip() == "['eventspool.spark.cli', 'eventspool.spark.extra']"


@pytest.mark.parametrize("module", SPARK_MODULES)
def test_a_spark_module_names_the_install_command(module: str) -> None:
    outcome = _run_without_extra(
        f"""
        import importlib
        from eventspool.spark.extra import SparkExtraMissingError
        try:
            importlib.import_module({module!r})
        except SparkExtraMissingError as exc:
            print(exc)
        """
    )
    assert INSTALL_COMMAND in outcome, f"{module} imported, or failed otherwise: {outcome}"


def test_the_pipeline_command_names_the_install_command() -> None:
    outcome = _run_without_extra(
        """
        import json
        from click.testing import CliRunner
        from eventspool.cli import main
        for command in ("run", "backfill"):
            result = CliRunner().invoke(main, ["pipeline", command, "--help"])
            assert result.exit_code == 0, result.output  # help needs no Spark
        arguments = ["--bootstrap-servers", "127.0.0.1:9", "--topic", "t", "--output", "out"]
        result = CliRunner().invoke(main, ["pipeline", "run", *arguments, "--local-db"])
        print(json.dumps({"exit_code": result.exit_code, "output": result.output}))
        """
    )
    result = json.loads(outcome.splitlines()[-1])
    assert result["exit_code"] == 1
    assert INSTALL_COMMAND in result["output"]
