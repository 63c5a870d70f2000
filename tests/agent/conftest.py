"""Fixtures for agent tests: `eventspool agent` as a real process."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventspool.broker import LocalBroker
from eventspool.testing.agent import AgentProcess, UnixHTTPConnection

AgentFactory = Callable[..., AgentProcess]


def call(agent: AgentProcess, method: str, target: str, body: object = None) -> tuple[int, Any]:
    """One HTTP request to the agent's socket; (status, decoded JSON body)."""
    connection = UnixHTTPConnection(agent.socket_path)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, target, body=payload)
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data.startswith(b"{") else data.decode()
    finally:
        connection.close()


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
