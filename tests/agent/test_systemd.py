"""systemd readiness: READY=1 once the agent's socket answers, STOPPING=1 when it stops."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventspool.agent.systemd import NOTIFY_SOCKET, notify
from eventspool.client.sync import Client
from tests.agent.conftest import AgentFactory


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A stand-in for systemd: the datagram socket that $NOTIFY_SOCKET names."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(os.fspath(path))
        sock.settimeout(30)
        monkeypatch.setenv(NOTIFY_SOCKET, os.fspath(path))
        yield sock


def received(sock: socket.socket) -> dict[str, str]:
    lines = sock.recv(4096).decode().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_without_a_service_manager_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NOTIFY_SOCKET, raising=False)
    assert notify("READY=1") is False


def test_an_abstract_socket_address_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"eventspool-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv(NOTIFY_SOCKET, "@" + name)
        assert notify("READY=1", "STATUS=x") is True
        assert received(sock) == {"READY": "1", "STATUS": "x"}


def test_a_vanished_manager_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NOTIFY_SOCKET, os.fspath(tmp_path / "gone.sock"))
    assert notify("READY=1") is False


def test_the_agent_reports_ready_once_it_answers_and_stopping_on_sigterm(
    agent_factory: AgentFactory, manager: socket.socket
) -> None:
    agent = agent_factory()
    agent.start(wait=False)
    ready = received(manager)
    assert ready["READY"] == "1"
    assert str(agent.socket_path) in ready["STATUS"]
    with Client(agent.socket_path, timeout=5) as client:
        assert client.ping() < 5
    agent.stop()
    assert received(manager)["STOPPING"] == "1"
