"""The C echo server the uds bench measures its floors against: it builds and echoes."""

from __future__ import annotations

import socket
from contextlib import closing
from pathlib import Path

import pytest

from harness.echo import EchoServer, connected, have_compiler, polled_round_trip, round_trip


@pytest.mark.skipif(not have_compiler(), reason="no C compiler (cc)")
def test_the_echo_server_builds_and_answers_a_round_trip(tmp_path: Path) -> None:
    with closing(EchoServer(tmp_path)) as server, connected(server.socket_path) as sock:
        round_trip(sock, b"x" * 100)
        sock.sendall(b"ping")
        assert sock.recv(16) == b"ping"
    assert server.process.returncode is not None


@pytest.mark.skipif(not have_compiler(), reason="no C compiler (cc)")
def test_the_busy_polling_echo_answers_polled_and_blocking_callers(tmp_path: Path) -> None:
    with closing(EchoServer(tmp_path, busy_poll_us=50)) as server:
        with connected(server.socket_path) as sock:
            for _ in range(100):
                polled_round_trip(sock, b"x" * 100, 50)
            polled_round_trip(sock, b"y" * 100, 0)  # one try without waiting, then it blocks
            round_trip(sock, b"z" * 100)
            with pytest.raises(BlockingIOError):  # each call read its own echo whole
                sock.recv(1, socket.MSG_DONTWAIT)
        with connected(server.socket_path) as sock:
            sock.close()  # a caller gone: the server goes on serving others
        with connected(server.socket_path) as sock:
            polled_round_trip(sock, b"x", 50)


def test_a_polled_round_trip_to_an_echo_that_stops_answering_fails() -> None:
    """The request is taken, the answer never comes whole: the read meets the end."""
    left, right = socket.socketpair()
    with left, right:
        right.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match="closed"):
            polled_round_trip(left, b"x" * 10, 50)
