"""`eventspool agent` as a real process: started, SIGKILLed and restarted on the same spool.

The kill tests and the soak drive the agent exactly as an operator's service manager
would: through its command line and agent.toml, never in-process, so a SIGKILL is a
real one and a restart really recovers the spool from disk.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eventspool.client.sync import AgentError, Client

__all__ = ["AgentProcess", "UnixHTTPConnection"]

_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 20.0
_LOG_TAIL_CHARS = 3000


class AgentProcess:
    """`eventspool agent` in its own process, with its config, socket and log in `directory`.

    `extra` is TOML placed after the [agent] keys: more of them, or whole tables such as
    [topics.NAME] or [exchanges.NAME]; `spool_keys` go into [spool]. `spool_dir` defaults
    to `directory/spool`; without `bootstrap` the agent only spools.
    """

    def __init__(
        self,
        directory: Path,
        bootstrap: str | None,
        extra: str = "",
        socket_path: Path | None = None,
        *,
        spool_dir: Path | None = None,
        max_event_bytes: int = 100_000,
        spool_keys: str = "",
    ) -> None:
        self.directory = directory
        self.socket_path = socket_path or directory / "agent.sock"
        self.config = directory / "agent.toml"
        spool = "spool" if spool_dir is None else os.fspath(spool_dir)
        self.config.write_text(
            f'[agent]\nspool_dir = "{spool}"\nsocket = "{self.socket_path}"\n{extra}\n'
            + ("" if bootstrap is None else f'[kafka]\nbootstrap_servers = "{bootstrap}"\n')
            + f"[spool]\nmax_event_bytes = {max_event_bytes}\n{spool_keys}\n"
        )
        self.log = directory / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("the agent was never started")
        return self.process.pid

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError as exc:
            return f"(log unreadable: {exc})"

    def start(self, wait: bool = True, extra_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Start the agent; with `wait`, return once its socket file exists."""
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
            deadline = time.monotonic() + _START_TIMEOUT_S
            while not self.socket_path.exists():
                self._check_running()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"agent did not start: {self.log_tail()}")
                time.sleep(0.05)
        return self.process

    def start_answering(self, timeout: float = _START_TIMEOUT_S) -> float:
        """Start the agent and return once it answers a PING: the seconds that took.

        The socket file of a killed agent is still there, so its existence proves
        nothing after a SIGKILL: only an answer does.
        """
        started = time.monotonic()
        self.start(wait=False)
        while True:
            self._check_running()
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"agent did not answer in {timeout} s: {self.log_tail()}")
            try:
                with Client(self.socket_path, timeout=0.2) as probe:
                    probe.ping()
            except AgentError:
                time.sleep(0.02)
                continue
            return time.monotonic() - started

    def freeze(self) -> None:
        """SIGSTOP the agent, returning once every thread of it has stopped: kill()
        returns before a thread running on another core stops, and the agent's unix
        listener answers a request in microseconds meanwhile."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while not _all_threads_stopped(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent's threads did not stop within {_STOP_TIMEOUT_S} s")
            time.sleep(0.001)

    def thaw(self) -> None:
        """SIGCONT the agent frozen by `freeze()`."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the agent and reap it; raises if it had already died by itself."""
        process = self.process
        if process is None:
            raise RuntimeError("the agent was never started")
        self._check_running()
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The agent's STATS answer, over a connection of its own."""
        with Client(self.socket_path, timeout=timeout) as probe:
            return probe.stats()

    def depth(self) -> int:
        """Events the agent holds that the broker has not acknowledged yet."""
        return sum(int(queue["depth"]) for queue in self.stats()["queues"])

    def wait_until_drained(self, timeout: float) -> float:
        """Until the agent holds no unacknowledged event; returns the seconds that took."""
        started = time.monotonic()
        while (depth := self.depth()) > 0:
            if time.monotonic() - started > timeout:
                raise RuntimeError(
                    f"{depth} events still unacknowledged after {timeout} s: {self.stats()}"
                )
            time.sleep(0.1)
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM (the agent answers what it holds and closes), SIGKILL if it hangs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _check_running(self) -> None:
        if self.process is not None and (code := self.process.poll()) is not None:
            raise RuntimeError(f"agent exited with {code}: {self.log_tail()}")


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (T in /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        if stat.rpartition(")")[2].split()[0] not in {"T", "t"}:
            return False
    return True


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 to the agent's unix socket, which serves HTTP beside the binary protocol."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(os.fspath(self._path))
