"""Fixtures for agent tests: `eventspool agent` as a real process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.testing.agent import AgentProcess

AgentFactory = Callable[..., AgentProcess]


@pytest.fixture
def agent_factory(broker: LocalBroker, tmp_path: Path) -> Iterator[AgentFactory]:
    started: list[AgentProcess] = []

    def make(
        extra: str = "", directory: Path | None = None, socket_path: Path | None = None
    ) -> AgentProcess:
        agent = AgentProcess(directory or tmp_path, broker.bootstrap_servers, extra, socket_path)
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.stop()
