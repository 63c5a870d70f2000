"""The floor of a request and its answer over a unix socket: a minimal epoll echo server in
C (`echo_server.c` beside this module), built with the machine's C compiler into a run's
scratch directory and run as its own process, and the round trip a caller makes to it.

Only the source is kept; a run compiles its own binary, so the floor is always this
machine's. Both ends may busy-poll, as eventspool's agent and client do: the floor of a
round trip in which neither blocks (`polled_round_trip`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("echo_server.c")
COMPILER = "cc"


def have_compiler() -> bool:
    return shutil.which(COMPILER) is not None


class EchoServer:
    """The echo server, built in `directory` and listening on `directory/echo.sock` until
    closed; its waits busy-poll for `busy_poll_us` first."""

    def __init__(self, directory: Path, busy_poll_us: float = 0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.binary = binary = directory / "echo_server"
        built = subprocess.run(
            [COMPILER, "-O2", "-o", binary, SOURCE], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            raise RuntimeError(f"{COMPILER} could not build {SOURCE.name}: {built.stderr}")
        self.socket_path = directory / "echo.sock"
        arguments = [os.fspath(binary), os.fspath(self.socket_path)]
        if busy_poll_us:
            arguments.append(f"{busy_poll_us:g}")
        self.process = subprocess.Popen(arguments, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError(f"the echo server did not start ({self.process.returncode})")

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def connected(path: str | Path) -> socket.socket:
    """A connection to the unix socket at `path` (the echo server's, or any other)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        raise
    return sock


def round_trip(sock: socket.socket, payload: bytes) -> None:
    """`payload` written to an echo and as many bytes read back: one request and its answer."""
    sock.sendall(payload)
    if len(sock.recv(len(payload), socket.MSG_WAITALL)) != len(payload):
        raise ConnectionError("the echo closed the connection")


def polled_round_trip(sock: socket.socket, payload: bytes, busy_poll_us: float) -> None:
    """`round_trip`, its answer read without waiting (the CPU yielded between tries) for
    up to `busy_poll_us` before the read blocks."""
    sock.sendall(payload)
    got = b""
    until = time.perf_counter() + busy_poll_us * 1e-6
    while len(got) < len(payload):
        try:
            chunk = sock.recv(len(payload) - len(got), socket.MSG_DONTWAIT)
        except BlockingIOError:
            if time.perf_counter() < until:
                os.sched_yield()
                continue
            chunk = sock.recv(len(payload) - len(got), socket.MSG_WAITALL)
        if not chunk:
            raise ConnectionError("the echo closed the connection")
        got += chunk
