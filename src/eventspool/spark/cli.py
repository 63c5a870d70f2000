"""``eventspool pipeline run|backfill``: the Spark jobs from the command line.

Spark and the jobs are imported when a command runs, so the rest of the command line
starts without loading them, and works without the `spark` extra installed.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from datetime import date, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import click

from eventspool.broker.address import bootstrap_servers_option
from eventspool.spark.extra import SparkExtraMissingError, require_spark_extra

_COMMON: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    bootstrap_servers_option,
    click.option(
        "--topic",
        "topics",
        multiple=True,
        help="A topic to read (repeatable); or use --topic-pattern.",
    ),
    click.option("--topic-pattern", help="Read every topic whose whole name matches this regex."),
    click.option(
        "--output",
        type=click.Path(file_okay=False, path_type=Path),
        required=True,
        help="Where archive/, stats/ and rewards/ (Parquet) go.",
    ),
    click.option(
        "--checkpoint",
        type=click.Path(file_okay=False, path_type=Path),
        help="Spark's checkpoint of the streaming job  [default: OUTPUT/_checkpoint]",
    ),
    click.option(
        "--dsn",
        envvar="EVENTSPOOL_PG_DSN",
        help="PostgreSQL connection string for the stats and rewards tables "
        "(env: EVENTSPOOL_PG_DSN); or --local-db.",
    ),
    click.option(
        "--local-db",
        is_flag=True,
        help="Start a throwaway PostgreSQL server on this machine for the tables instead of "
        "--dsn; it and its tables are removed when the command ends (the Parquet outputs "
        "stay). Needs the PostgreSQL server package.",
    ),
    click.option(
        "--rules",
        "rules_path",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="Reward rules (TOML)  [default: 2% cashback on paid orders, 500 cents a day]",
    ),
    click.option(
        "--master",
        default="local[*]",
        show_default=True,
        help="Spark master: local[N], local-cluster[W,C,MB] or spark://host:port.",
    ),
    click.option(
        "--kafka",
        "kafka_settings",
        multiple=True,
        metavar="KEY=VALUE",
        help="A librdkafka consumer setting, e.g. security.protocol=SSL (repeatable).",
    ),
]


def _common(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_COMMON):
        command = option(command)
    return command


def _kafka(settings: tuple[str, ...]) -> dict[str, str]:
    result: dict[str, str] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{setting!r} is not KEY=VALUE", param_hint="--kafka")
        result[key.strip()] = value.strip()
    return result


def _echo(line: str) -> None:
    click.echo(line, err=True)


def _require_spark() -> None:
    """Stop a command of the pipeline before it starts anything, when Spark is missing."""
    try:
        require_spark_extra()
    except SparkExtraMissingError as exc:
        raise click.ClickException(str(exc)) from exc


@contextlib.contextmanager
def _database(params: dict[str, Any]) -> Iterator[None]:
    """Set params["dsn"]: the one given, or a throwaway server's for the command's life."""
    if params["local_db"] == bool(params["dsn"]):
        raise click.UsageError("give --dsn (or EVENTSPOOL_PG_DSN) or --local-db, one of them")
    if not params["local_db"]:
        yield
        return
    from eventspool.spark.pgserver import LocalPostgres, PostgresUnavailableError  # noqa: PLC0415

    try:
        with LocalPostgres() as server:
            _echo(f"a throwaway PostgreSQL for this run: {server.dsn}")
            params["dsn"] = server.dsn
            yield
    except PostgresUnavailableError as exc:
        raise click.ClickException(str(exc)) from exc


def _config(params: dict[str, Any], **extra: Any) -> Any:
    from eventspool.spark.jobs.rules import RuleError, load_rules  # noqa: PLC0415
    from eventspool.spark.jobs.runner import PipelineConfig  # noqa: PLC0415

    topics: tuple[str, ...] = params["topics"]
    pattern: str | None = params["topic_pattern"]
    if bool(topics) == (pattern is not None):
        raise click.UsageError("give --topic (one or more) or --topic-pattern, not both")
    try:
        rules = load_rules(params["rules_path"])
    except RuleError as exc:
        raise click.ClickException(str(exc)) from exc
    output: Path = params["output"]
    return PipelineConfig(
        bootstrap_servers=params["bootstrap_servers"],
        output=output,
        checkpoint=params["checkpoint"] or output / "_checkpoint",
        dsn=params["dsn"],
        topics=topics,
        topic_pattern=pattern,
        rules=rules,
        kafka=_kafka(params["kafka_settings"]),
        **extra,
    )


@click.group()
def pipeline() -> None:
    """The Spark jobs: raw archive, per-minute statistics, daily rewards."""


@pipeline.command()
@_common
@click.option("--once", is_flag=True, help="Process what is in Kafka now, then stop.")
@click.option(
    "--starting-offsets",
    default="earliest",
    show_default=True,
    help="Where a new checkpoint starts: earliest, latest or Spark's JSON form.",
)
@click.option(
    "--max-offsets-per-trigger", type=click.IntRange(min=1), help="Records per micro-batch."
)
@click.option(
    "--watermark",
    default="1 hour",
    show_default=True,
    help="How long after an event a duplicate of it is still dropped (late events are kept).",
)
@click.option("--trigger-seconds", default=5.0, show_default=True, help="Seconds between batches.")
def run(**params: Any) -> None:
    """Stream from Kafka into the outputs, exactly once (stop with Ctrl-C or SIGTERM)."""
    _require_spark()
    with _database(params):
        _run(params)


def _run(params: dict[str, Any]) -> None:
    from eventspool.spark.jobs.runner import describe  # noqa: PLC0415
    from eventspool.spark.jobs.runner import run as run_pipeline  # noqa: PLC0415
    from eventspool.spark.session import build_session  # noqa: PLC0415

    config = _config(
        params,
        starting_offsets=params["starting_offsets"],
        max_offsets_per_trigger=params["max_offsets_per_trigger"],
        watermark=params["watermark"],
        trigger_seconds=params["trigger_seconds"],
    )
    stop = {"requested": False}

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, request_stop)
    spark = build_session(params["master"], "eventspool-pipeline")
    _echo(f"pipeline: {spark.sparkContext.master}, checkpoint {config.checkpoint}")
    try:
        summary = run_pipeline(
            spark,
            config,
            once=params["once"],
            progress=_echo,
            should_stop=lambda: stop["requested"],
        )
    except KeyboardInterrupt:
        _echo("interrupted")
        return
    finally:
        spark.stop()
    for line in describe(summary):
        click.echo(line)


def _date(_ctx: click.Context, _param: click.Parameter, value: str) -> date:
    try:
        return datetime.strptime(value, "%Y-%m-%d").date()
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date like 2026-11-21") from None


@pipeline.command()
@_common
@click.option("--from", "first", required=True, callback=_date, help="First UTC day, YYYY-MM-DD.")
@click.option("--to", "last", required=True, callback=_date, help="Last UTC day (inclusive).")
def backfill(**params: Any) -> None:
    """Recompute whole UTC days from Kafka and replace them in every output."""
    _require_spark()
    with _database(params):
        _backfill(params)


def _backfill(params: dict[str, Any]) -> None:
    from eventspool.spark.jobs.runner import backfill as run_backfill  # noqa: PLC0415
    from eventspool.spark.jobs.runner import describe  # noqa: PLC0415
    from eventspool.spark.session import build_session  # noqa: PLC0415

    config = _config(params)
    if params["last"] < params["first"]:
        raise click.BadParameter("--to is before --from", param_hint="--to")
    spark = build_session(params["master"], "eventspool-backfill")
    try:
        summary = run_backfill(spark, config, params["first"], params["last"], progress=_echo)
    finally:
        spark.stop()
    for line in describe(summary):
        click.echo(line)
