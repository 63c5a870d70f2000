"""The `eventspool` command line."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import click

from eventspool.agent.config import load_agent_config
from eventspool.agent.config_loader import ConfigError
from eventspool.agent.http import BadRequestError, parse_event
from eventspool.agent.service import run
from eventspool.broker.address import bootstrap_servers_option, running_embedded_broker
from eventspool.broker.cli import broker
from eventspool.broker.local import BrokerError
from eventspool.client.sync import AgentError, Client
from eventspool.consumer import Consumer, ConsumerSettings, HandlerError, Ordering
from eventspool.consumer.metrics import serve_metrics
from eventspool.errors import EventspoolError, SpoolLockedError
from eventspool.spark.cli import pipeline
from eventspool.spool.inspect import QueueReport, SpoolReport, inspect_spool
from eventspool.status import render_status
from eventspool.tail import (
    DEFAULT_FORMAT,
    Record,
    Start,
    compile_format,
    parse_start,
    read,
    record_json,
)
from eventspool.topics import topic_ends

# The same option on every command that talks to the agent, so they agree on the socket.
_socket_option = click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="EVENTSPOOL_AGENT_SOCKET",
    default=Path("spool") / "agent.sock",
    show_default=True,
    help="The agent's socket (env: EVENTSPOOL_AGENT_SOCKET).",
)

# The same option on every command that talks to Kafka itself.
_kafka_option = click.option(
    "--kafka",
    "kafka_options",
    multiple=True,
    metavar="NAME=VALUE",
    help="librdkafka setting (repeatable), e.g. --kafka security.protocol=SSL.",
)


def _kafka_settings(options: tuple[str, ...]) -> dict[str, str]:
    """The --kafka NAME=VALUE options as librdkafka settings."""
    kafka: dict[str, str] = {}
    for option in options:
        name, sep, value = option.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{option!r}: expected NAME=VALUE", param_hint="--kafka")
        kafka[name] = value
    return kafka


# `consume` shows the library's own defaults, so the command and the API cannot drift apart.
_CONSUMER_DEFAULTS = ConsumerSettings()


_Command = TypeVar("_Command", bound=Callable[..., Any])


def _setting_option(name: str, default: object, kind: Any) -> Callable[[_Command], _Command]:
    """An option of `consume` for one setting, its default shown."""
    return click.option(name, type=kind, default=default, show_default=True)


@click.group()
@click.version_option(package_name="eventspool")
def main() -> None:
    """eventspool: a durable local spool in front of Kafka."""


@main.group()
def spool() -> None:
    """Work with a spool directory."""


@spool.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
def inspect(directory: Path, as_json: bool) -> None:
    """Show every queue of DIRECTORY: depth, bytes, oldest age, positions, damage found.

    Read-only: it scans each queue as a recovery would and changes nothing, so it is
    safe on the directory of a dead producer and, as a snapshot, of a live one.
    """
    try:
        report = inspect_spool(directory)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(_report_json(report), indent=2))
        return
    _print_report(report)
    if any(q.error for q in report.queues):
        raise SystemExit(1)


def _report_json(report: SpoolReport) -> dict[str, object]:
    return {
        "directory": str(report.directory),
        "owner_pid": report.owner_pid,
        "partition_counts": report.partition_counts,
        "queues": [
            {
                "topic": q.topic,
                "partition": q.partition,
                "segment": q.segment,
                "path": str(q.path),
                "error": q.error,
                "stats": asdict(q.stats) if q.stats else None,
                "recovery": asdict(q.recovery) if q.recovery else None,
            }
            for q in report.queues
        ],
    }


_COLUMNS = ("QUEUE", "DEPTH", "BYTES", "OLDEST", "HEAD", "NEXT", "DROPPED", "SKIPPED", "STATE")


def _row(q: QueueReport) -> tuple[str, ...]:
    name = f"{q.topic}/{'pending' if q.partition is None else q.partition}"
    if q.segment:
        name += f" segment {q.segment}"
    if q.stats is None or q.recovery is None:
        return (name, "-", "-", "-", "-", "-", "-", "-", f"ERROR {q.error}")
    s, r = q.stats, q.recovery
    state = f"DAMAGED: {r.stop_reason}" if r.corrupt_tail else "ok"
    skipped = f"{r.skipped_records} ({s.skipped_total + r.skipped_records} total)"
    return (
        name,
        str(s.depth),
        _human_bytes(s.bytes),
        "-" if s.oldest_age_ms is None else f"{s.oldest_age_ms / 1000:.1f}s",
        str(s.head_seq),
        str(s.next_seq),
        str(s.dropped),
        skipped,
        state,
    )


def _print_report(report: SpoolReport) -> None:
    owner = (
        f"owned by live pid {report.owner_pid} (figures are a snapshot)"
        if report.owner_pid
        else "not in use"
    )
    click.echo(f"spool {report.directory}: {owner}")
    counts = ", ".join(f"{t}={n}" for t, n in sorted(report.partition_counts.items()))
    click.echo(f"partition counts: {counts or 'none known'}")
    if not report.queues:
        click.echo("no queues")
        return
    rows = [_COLUMNS, *(_row(q) for q in report.queues)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        click.echo("  ".join([*cells, row[-1]]))


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}GiB"


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="agent.toml; environment variables EVENTSPOOL_<SECTION>_<KEY> override it.",
)
@click.option(
    "--adopt",
    "adopted",
    multiple=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Also drain this spool directory left behind by a dead producer (repeatable).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
def agent(config_path: Path | None, adopted: tuple[Path, ...], verbose: bool) -> None:
    """Run the agent: own a spool directory, ship it to Kafka, accept events on a socket."""
    try:
        config = load_agent_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    _configure_logging(verbose)
    if config.bootstrap_servers is None:
        _hint_embedded_broker()
    try:
        run(config, adopted)
    except SpoolLockedError as exc:
        raise click.ClickException(f"another agent is running: {exc}") from exc
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _configure_logging(verbose: bool) -> None:
    """What the long-running commands (agent, consume) log goes to stderr, with its time."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _embedded_broker_address() -> str | None:
    try:
        found = running_embedded_broker()
    except BrokerError:
        return None
    return None if found is None else found[0].bootstrap_servers


# The embedded broker (tansu) holds a group's first join for half of session.timeout.ms:
# librdkafka's 45 s default meant 23 s before a consumer's first partitions.
_LOCAL_BROKER_KAFKA = {"session.timeout.ms": "6000"}


def _hint_embedded_broker() -> None:
    """A spool-only agent is a valid set-up, so it is never pointed at the embedded broker
    behind its operator's back; but one that runs here is likely what was meant."""
    address = _embedded_broker_address()
    if address is not None:
        logging.getLogger(__name__).warning(
            "no kafka.bootstrap_servers: spooling only, sending nothing; to ship to the "
            "embedded broker running here, set EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS=%s",
            address,
        )


@main.command()
@click.argument("topic")
@_socket_option
@click.option(
    "--json",
    "json_lines",
    is_flag=True,
    help='Each line is one event object, as the HTTP interface takes it: {"value": "text", '
    '"key": "text", "headers": {"name": "text"}} (value_b64/key_b64 for bytes, event_id).',
)
def send(topic: str, socket_path: Path, json_lines: bool) -> None:
    """Send each line of standard input to TOPIC through the agent; print the event ids."""
    sent = failed = 0
    with Client(socket_path) as client:
        for number, raw_line in enumerate(sys.stdin, start=1):
            line = raw_line.rstrip("\n")
            if not line:
                continue
            try:
                if json_lines:
                    event = parse_event(json.loads(line), number)
                    event_id = client.send(
                        topic, event.value, event.key, event.headers, event_id=event.event_id
                    )
                else:
                    event_id = client.send(topic, line.encode())
            except (ValueError, BadRequestError, EventspoolError) as exc:
                failed += 1
                click.echo(f"line {number}: {exc}", err=True)
                continue
            sent += 1
            click.echo(event_id)
    click.echo(f"sent {sent}, failed {failed}", err=True)
    if failed:
        raise SystemExit(1)


@main.command()
@_socket_option
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one table and exit (for scripts).")
def status(socket_path: Path, interval: float, once: bool) -> None:
    """A live table of the agent's queues: depth, oldest unsent age, rates, drops, dead letters."""
    with Client(socket_path, timeout=5) as client:
        try:
            previous = client.stats()
            if once:
                click.echo(render_status(previous, previous, interval))
                return
            while True:
                time.sleep(interval)
                current = client.stats()
                click.clear()
                click.echo(render_status(previous, current, interval))
                previous = current
        except AgentError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            return


main.add_command(broker)


@main.command()
@click.option("--group", required=True, help="Consumer group id.")
@click.option("--topic", "topics", multiple=True, required=True, help="Topic (repeatable).")
@click.option("--handler", required=True, help="module:function, called with each Record.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=_CONSUMER_DEFAULTS.concurrency,
    show_default=True,
    help="Calls at once per worker of an async def handler (a plain function: 1).",
)
@bootstrap_servers_option
@click.option(
    "--ordering",
    type=click.Choice([o.value for o in Ordering]),
    default=_CONSUMER_DEFAULTS.ordering.value,
    show_default=True,
    help="key: one event per key at a time; partition: one batch per partition; unordered.",
)
@_setting_option("--max-buffered", _CONSUMER_DEFAULTS.max_buffered, click.IntRange(min=1))
@_setting_option("--commit-every-n", _CONSUMER_DEFAULTS.commit_every_n, click.IntRange(min=1))
@_setting_option("--commit-every-s", _CONSUMER_DEFAULTS.commit_every_s, float)
@click.option("--max-age", type=float, default=None, help="Skip events older than this (s).")
@click.option("--stale-topic", default=None, help="Forward skipped events here ({topic}).")
@_setting_option("--dead-letter-topic", _CONSUMER_DEFAULTS.dead_letter_topic, str)
@_setting_option("--max-attempts", _CONSUMER_DEFAULTS.max_attempts, click.IntRange(min=1))
@_setting_option("--shutdown-timeout", _CONSUMER_DEFAULTS.shutdown_timeout_s, float)
@_kafka_option
@click.option(
    "--status-interval",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds between status lines on stderr (0: none).",
)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics here.")
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
def consume(
    *,
    group: str,
    topics: tuple[str, ...],
    handler: str,
    workers: int,
    concurrency: int,
    bootstrap_servers: str,
    ordering: str,
    max_buffered: int,
    commit_every_n: int,
    commit_every_s: float,
    max_age: float | None,
    stale_topic: str | None,
    dead_letter_topic: str,
    max_attempts: int,
    shutdown_timeout: float,
    kafka_options: tuple[str, ...],
    status_interval: float,
    metrics_port: int | None,
    verbose: bool,
) -> None:
    """Run HANDLER on every event of the topics, in worker processes.

    SIGTERM or Ctrl-C stops taking events, lets running handlers finish for up to
    --shutdown-timeout seconds, commits what is done and leaves the group.
    """
    # Like `python -m`, resolve the handler's module from the current directory too.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    _configure_logging(verbose)
    kafka = _kafka_settings(kafka_options)
    if bootstrap_servers == _embedded_broker_address():
        local = {k: v for k, v in _LOCAL_BROKER_KAFKA.items() if k not in kafka}
        if local:
            kafka = {**kafka, **local}
            click.echo(
                "on the embedded broker: "
                + ", ".join(f"{k}={v}" for k, v in local.items())
                + " (it holds a group's first join for half the session timeout; "
                "--kafka session.timeout.ms=N to choose)",
                err=True,
            )
    try:
        settings = ConsumerSettings(
            ordering=Ordering(ordering),
            concurrency=concurrency,
            max_buffered=max_buffered,
            commit_every_n=commit_every_n,
            commit_every_s=commit_every_s,
            max_age_s=max_age,
            stale_topic=stale_topic,
            dead_letter_topic=dead_letter_topic,
            max_attempts=max_attempts,
            shutdown_timeout_s=shutdown_timeout,
            kafka=kafka,
        )
        consumer = Consumer(
            group,
            list(topics),
            handler,
            workers=workers,
            bootstrap_servers=bootstrap_servers,
            settings=settings,
        )
    except (ValueError, HandlerError) as exc:
        raise click.ClickException(str(exc)) from exc
    done = threading.Event()
    if status_interval > 0:
        threading.Thread(
            target=_print_status_lines, args=(consumer, status_interval, done), daemon=True
        ).start()
    try:
        if metrics_port is not None:
            serve_metrics(consumer, metrics_port)
        final = consumer.run()
    except EventspoolError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        done.set()
    click.echo(f"stopped: {final.line()}", err=True)


def _print_status_lines(consumer: Consumer, interval: float, done: threading.Event) -> None:
    while not done.wait(interval):
        click.echo(consumer.status().line(), err=True)


main.add_command(pipeline)


def _start(_context: click.Context, _param: click.Parameter, text: str) -> Start:
    try:
        return parse_start(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _format(
    _context: click.Context, _param: click.Parameter, template: str | None
) -> Callable[[Record], bytes] | None:
    try:
        return None if template is None else compile_format(template)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _json_line(record: Record) -> bytes:
    return json.dumps(record_json(record), ensure_ascii=False).encode() + b"\n"


@main.command()
@click.argument("topic")
@bootstrap_servers_option
@click.option(
    "-o",
    "--offset",
    "start",
    default="beginning",
    show_default=True,
    callback=_start,
    help="Where each partition starts, as kcat's -o: beginning, end, an offset N, or -N "
    "for its last N records.",
)
@click.option("--follow", is_flag=True, help="Keep waiting for new records (Ctrl-C ends).")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per record: topic, partition, offset, timestamp (ms), key, value, "
    "headers; text where UTF-8, else key_b64, value_b64, headers_b64.",
)
@click.option(
    "--format",
    "render",
    callback=_format,
    show_default=DEFAULT_FORMAT,
    help="As kcat's -f: %t topic, %p partition, %o offset, %T timestamp (ms), %k key, "
    "%s value, %K and %S their lengths (-1: null), %h headers (name=value,...), %% a "
    r"percent sign; \n \t \r \\ escapes (end with \n for one line per record).",
)
@_kafka_option
def tail(
    *,
    topic: str,
    bootstrap_servers: str,
    start: Start,
    follow: bool,
    count: int | None,
    as_json: bool,
    render: Callable[[Record], bytes] | None,
    kafka_options: tuple[str, ...],
) -> None:
    """Print the records of TOPIC, without joining a consumer group or committing.

    Without --follow it stops at the end each partition had when it started.
    """
    if as_json and render is not None:
        raise click.UsageError("give --json or --format, not both")
    output = _json_line if as_json else render or compile_format(DEFAULT_FORMAT)
    kafka = {**_kafka_settings(kafka_options), "bootstrap.servers": bootstrap_servers}
    try:
        for record in read(kafka, topic, start, follow=follow, count=count):
            click.echo(output(record), nl=False)
    except EventspoolError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and let no final flush fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@main.command()
@bootstrap_servers_option
@click.option("--partitions", is_flag=True, help="One line per partition instead of per topic.")
@_kafka_option
def topics(bootstrap_servers: str, partitions: bool, kafka_options: tuple[str, ...]) -> None:
    """List the topics (not the internal "__" ones) with their partitions and end offsets.

    An end is the offset after a partition's last record, exact also on the embedded
    broker; a topic's END is the sum of its partitions' ends.
    """
    kafka = {**_kafka_settings(kafka_options), "bootstrap.servers": bootstrap_servers}
    try:
        ends = topic_ends(kafka)
    except EventspoolError as exc:
        raise click.ClickException(str(exc)) from exc
    if not ends:
        click.echo("no topics")
        return
    if partitions:
        rows = [("TOPIC", "PARTITION", "END")]
        rows += [(t, str(p), str(end)) for t, by_id in ends.items() for p, end in by_id.items()]
    else:
        rows = [("TOPIC", "PARTITIONS", "END")]
        rows += [(t, str(len(by_id)), str(sum(by_id.values()))) for t, by_id in ends.items()]
    _print_table(rows)


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        click.echo("  ".join(cells).rstrip())
