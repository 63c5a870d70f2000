"""The C echo server the uds bench measures its floors against: it builds and echoes."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest

from harness.echo import EchoServer, connected, have_compiler, round_trip


@pytest.mark.skipif(not have_compiler(), reason="no C compiler (cc)")
def test_the_echo_server_builds_and_answers_a_round_trip(tmp_path: Path) -> None:
    with closing(EchoServer(tmp_path)) as server, connected(server.socket_path) as sock:
        round_trip(sock, b"x" * 100)
        sock.sendall(b"ping")
        assert sock.recv(16) == b"ping"
    assert server.process.returncode is not None
