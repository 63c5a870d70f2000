"""The agent a bench measures: `eventspool agent` on its defaults, as its own process."""

from __future__ import annotations

from pathlib import Path

from eventspool.config import SpoolSettings
from eventspool.testing.agent import AgentProcess

START_TIMEOUT_S = 30.0


def start_agent(directory: Path, bootstrap: str, extra: str = "") -> AgentProcess:
    """`eventspool agent` in `directory` on its defaults (max_event_bytes too, not the
    test default) plus `extra` config; returns once it answers. The caller stops it."""
    agent = configured_agent(directory, bootstrap, extra)
    agent.start_answering(START_TIMEOUT_S)
    return agent


def configured_agent(directory: Path, bootstrap: str, extra: str = "") -> AgentProcess:
    """`start_agent`'s agent, its config written, not started."""
    directory.mkdir(parents=True, exist_ok=True)
    return AgentProcess(
        directory,
        bootstrap,
        extra,
        spool_dir=directory / "agent-spool",
        max_event_bytes=SpoolSettings().max_event_bytes,
    )
