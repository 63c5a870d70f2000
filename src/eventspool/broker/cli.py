"""``eventspool broker start|stop|status``: a background broker shared by shell sessions."""

from __future__ import annotations

from pathlib import Path

import click

from eventspool.broker.console import run_console
from eventspool.broker.local import (
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV_VAR,
    BrokerError,
    default_state_dir,
    start_detached,
    state_path,
    status,
    stop_detached,
)

# The same option on every command, so start, stop and status agree on the state file;
# its default is the one the other commands look in for a running broker.
_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default=str(DEFAULT_STATE_DIR),
    help=f"Directory for the broker's state file and log (env: {STATE_DIR_ENV_VAR}).",
)


@click.group(name="broker", invoke_without_command=True)
@click.option(
    "--brokers",
    type=click.IntRange(min=1),
    help="Run a cluster of this many brokers (librdkafka's mock cluster) in the foreground, "
    "with a console to move leaders, take brokers down and inject errors.",
)
@click.pass_context
def broker(context: click.Context, brokers: int | None) -> None:
    """Run a local in-memory Kafka-compatible broker (tansu) in the background, or with
    --brokers N a multi-broker cluster in the foreground to try failovers by hand."""
    if brokers is not None:
        if context.invoked_subcommand is not None:
            raise click.UsageError("--brokers runs a cluster of its own; give no subcommand")
        run_console(brokers)
    elif context.invoked_subcommand is None:
        click.echo(context.get_help())


@broker.command()
@click.option("--port", type=click.IntRange(1, 65535), help="Listen port  [default: a free one]")
@_state_dir_option
def start(port: int | None, state_dir: Path) -> None:
    """Start the broker and print its bootstrap servers (HOST:PORT).

    It keeps every topic and record in memory only: stopping it loses them. The other
    commands given no --bootstrap-servers find it through its state file.
    """
    try:
        state = start_detached(state_dir, port=port)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(state.bootstrap_servers)
    click.echo(
        "the broker keeps everything in memory: `eventspool broker stop` loses every topic "
        f"and record; its state file {state_path(state_dir)} tells the other eventspool "
        "commands where it listens",
        err=True,
    )


@broker.command()
@_state_dir_option
def stop(state_dir: Path) -> None:
    """Stop the broker; succeeds when none is running, so it is safe in cleanup scripts."""
    try:
        state = stop_detached(state_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("not running" if state is None else f"stopped pid {state.pid}")


@broker.command(name="status")
@_state_dir_option
def status_command(state_dir: Path) -> None:
    """Show the running broker; exit status 1 when none is running."""
    try:
        state = status(state_dir)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    if state is None:
        click.echo("not running")
        raise click.exceptions.Exit(1)
    click.echo(f"running pid {state.pid} on {state.bootstrap_servers} (log: {state.log_path})")
