"""Where the command line finds Kafka: the address given, else the running embedded broker.

One rule for every command that needs bootstrap servers. None of them falls back to an
address nobody started: librdkafka would retry it for ever, logging every refusal.
"""

from __future__ import annotations

from pathlib import Path

import click

from eventspool.broker.local import BrokerError, BrokerState, default_state_dir, state_path, status

BOOTSTRAP_ENV_VAR = "EVENTSPOOL_BOOTSTRAP_SERVERS"


def running_embedded_broker() -> tuple[BrokerState, Path] | None:
    """The broker `eventspool broker start` runs for this folder (or EVENTSPOOL_STATE_DIR),
    with its state file; None when none answers there. Raises BrokerError for a state
    file that cannot be read."""
    state_dir = default_state_dir()
    state = status(state_dir)
    return None if state is None else (state, state_path(state_dir))


def resolve_bootstrap_servers(given: str | None) -> str:
    """*given* (the option or its variable), else the running embedded broker's address,
    said on stderr so the choice is never silent; else an error naming both ways out."""
    if given:
        return given
    try:
        found = running_embedded_broker()
    except BrokerError as exc:
        raise click.ClickException(f"no --bootstrap-servers given, and {exc}") from exc
    if found is None:
        raise click.ClickException(
            "no --bootstrap-servers given and no embedded broker running (its state file "
            f"{state_path(default_state_dir())} is missing or stale): give "
            f"--bootstrap-servers HOST:PORT (or set {BOOTSTRAP_ENV_VAR}), or start one with "
            "`eventspool broker start`"
        )
    state, path = found
    click.echo(f"using the embedded broker at {state.bootstrap_servers} (from {path})", err=True)
    return state.bootstrap_servers


def _resolve(_context: click.Context, _param: click.Parameter, given: str | None) -> str:
    return resolve_bootstrap_servers(given)


#: The --bootstrap-servers option of every command that talks to Kafka.
bootstrap_servers_option = click.option(
    "--bootstrap-servers",
    envvar=BOOTSTRAP_ENV_VAR,
    callback=_resolve,
    metavar="HOST:PORT[,HOST:PORT]",
    help=f"Kafka brokers (env: {BOOTSTRAP_ENV_VAR})  [default: the embedded broker that "
    "`eventspool broker start` runs, found through its state file]",
)
