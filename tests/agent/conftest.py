"""Fixtures for agent tests: `eventspool agent` as a real process."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from eventspool.broker import LocalBroker

AgentFactory = Callable[..., "AgentProcess"]


class AgentProcess:
    """`eventspool agent` in its own process, with its socket and log."""

    def __init__(
        self, directory: Path, bootstrap: str, extra: str = "", socket_path: Path | None = None
    ) -> None:
        self.directory = directory
        self.socket_path = socket_path or directory / "agent.sock"
        self.config = directory / "agent.toml"
        self.config.write_text(
            f'[agent]\nspool_dir = "spool"\nsocket = "{self.socket_path}"\n{extra}\n'
            f'[kafka]\nbootstrap_servers = "{bootstrap}"\n[spool]\nmax_event_bytes = 100000\n'
        )
        self.log = directory / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True, extra_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eventspool",
                    "agent",
                    "--config",
                    str(self.config),
                    *extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait:
            deadline = time.monotonic() + 20
            while not self.socket_path.exists():
                assert self.process.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, "agent did not start"
                time.sleep(0.05)
        return self.process

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("agent", timeout=30)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(self._path))


def call(agent: AgentProcess, method: str, target: str, body: object = None) -> tuple[int, Any]:
    """One HTTP request to the agent's socket; (status, decoded JSON body)."""
    connection = _UnixHTTPConnection(agent.socket_path)
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
