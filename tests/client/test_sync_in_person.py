"""The blocking client's call made in person (compiled: `PipelineCore.call`) against a
scripted peer on a real unix socket, for what a real agent never does on its own:
answers cut across reads, refusals, errors, silence, hang-ups, a socket that cannot
take a large event at once. The sanitizer test runs this file against the
instrumented build.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from eventspool import SpoolFullError
from eventspool._core.native import block_with_timeout, connect_unix
from eventspool.client.sync import AgentError, Client
from eventspool.client.sync_connection import Connection
from eventspool.wire.protocol import (
    EventResult,
    Frame,
    Status,
    encode_error,
    encode_send_result,
)
from tests.wire_support import listening, scripted_agent

EVENT_ID = "0190a5c3-7e1f-7a00-8c2b-3d4e5f607182"


def test_a_lone_call_whose_answer_comes_in_pieces_gets_it_whole(tmp_path: Path) -> None:
    def halves(frame: Frame) -> list[bytes]:
        answer = encode_send_result(frame.request_id, [EventResult(Status.OK, EVENT_ID)])
        return [answer[:7], answer[7:]]

    scripted_agent(tmp_path / "a.sock", halves)
    with Client(tmp_path / "a.sock") as client:
        assert client.send("t", b"v") == EVENT_ID
        assert client.send("t", b"v") == EVENT_ID  # and the connection is still in step


def test_a_lone_call_refused_raises_its_own_error(tmp_path: Path) -> None:
    def full(frame: Frame) -> list[bytes]:
        return [encode_send_result(frame.request_id, [EventResult(Status.SPOOL_FULL, "full")])]

    scripted_agent(tmp_path / "a.sock", full)
    with Client(tmp_path / "a.sock") as client, pytest.raises(SpoolFullError, match="full"):
        client.send("t", b"v")


def test_a_lone_call_answered_by_a_connection_error_fails_in_words(tmp_path: Path) -> None:
    def refused(_frame: Frame) -> list[bytes]:
        return [encode_error(0, Status.MALFORMED, "out of step")]

    scripted_agent(tmp_path / "a.sock", refused)
    with Client(tmp_path / "a.sock") as client, pytest.raises(AgentError, match="out of step"):
        client.send("t", b"v")


def test_a_lone_call_larger_than_the_socket_takes_is_written_whole(tmp_path: Path) -> None:
    """The compiled call writes what the socket takes without waiting; the rest of a
    large event is written by the pipeline, waiting for room, and answered as usual."""
    seen: list[int] = []

    def accept(frame: Frame) -> list[bytes]:
        seen.append(len(frame.body))
        return [encode_send_result(frame.request_id, [EventResult(Status.OK, EVENT_ID)])]

    scripted_agent(tmp_path / "a.sock", accept)
    with Client(tmp_path / "a.sock") as client:
        assert client.send("t", b"x" * 4_000_000) == EVENT_ID
        assert client.send("t", b"v") == EVENT_ID
    assert seen[0] > 4_000_000


def test_a_lone_call_without_an_answer_fails_within_its_timeout(tmp_path: Path) -> None:
    scripted_agent(tmp_path / "a.sock", lambda _frame: [])  # never answers
    started = time.monotonic()
    with (
        Client(tmp_path / "a.sock", timeout=0.3) as client,
        pytest.raises(AgentError, match=r"no answer within 0\.3 s.*outcome is unknown"),
    ):
        client.send("t", b"v")
    assert time.monotonic() - started < 5


def test_a_lone_call_whose_agent_hangs_up_fails_in_words(tmp_path: Path) -> None:
    """The agent reads the SEND and closes the connection: its outcome is unknown."""
    listener = listening(tmp_path / "a.sock")

    def hang_up() -> None:
        with listener, listener.accept()[0] as peer:
            peer.recv(65536)

    threading.Thread(target=hang_up, daemon=True).start()
    with (
        Client(tmp_path / "a.sock") as client,
        pytest.raises(AgentError, match="the agent closed the connection"),
    ):
        client.send("t", b"v")


def test_closing_the_client_ends_a_lone_call_at_once(tmp_path: Path) -> None:
    scripted_agent(tmp_path / "a.sock", lambda _frame: [])  # never answers
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        threading.Timer(0.3, client.close).start()
        started = time.monotonic()
        with pytest.raises(AgentError, match="outcome is unknown"):
            client.send("t", b"v")
        assert time.monotonic() - started < 5


def test_closing_the_client_ends_a_write_waiting_for_room_at_once(tmp_path: Path) -> None:
    """A peer that never reads: the writer waits for room in the socket; close() must wake it."""
    listener = listening(tmp_path / "a.sock")
    with listener, Client(tmp_path / "a.sock", timeout=30.0) as client:
        threading.Timer(0.3, client.close).start()
        started = time.monotonic()
        with pytest.raises(AgentError):
            client.send_many("t", [b"x" * 60_000] * 200)  # 12 MB, more than the socket holds
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("timeout", [0.25, 3.5, 1e-7])
def test_a_socket_gives_up_after_its_timeout_never_zero_which_means_never(
    timeout: float,
) -> None:
    """The kernel keeps the timeout in clock ticks, rounded up: what it gives back is at
    least the timeout and less than a tick (at most 10 ms) over it, and never zero."""
    with socket.socket(socket.AF_UNIX) as sock:
        block_with_timeout(sock.fileno(), timeout)
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("@ll"))
            seconds, micros = struct.unpack("@ll", raw)
            kept = seconds + micros / 1e6
            assert kept > 0
            assert timeout - 1e-6 <= kept < timeout + 0.0101


def test_timeouts_on_something_not_a_socket_raise_oserror(tmp_path: Path) -> None:
    with open(tmp_path / "plain", "wb") as plain, pytest.raises(OSError):
        block_with_timeout(plain.fileno(), 1.0)


def _in_a_process_of_its_own(check: str, tmp_path: Path) -> None:
    """Runs one of `tests.client.connect_failures`' checks, which count the open
    descriptors, in a child whose only thread is the check's."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.client.connect_failures", check, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_connect_unix_gives_a_blocking_close_on_exec_socket_with_its_timeouts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.sock"
    with listening(path) as listener:
        fd = connect_unix(str(path), 0.5)
        peer, _ = listener.accept()
        with peer, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd) as sock:
            assert os.get_blocking(fd) and not os.get_inheritable(fd)
            for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("@ll"))
                seconds, micros = struct.unpack("@ll", raw)
                assert 0.5 <= seconds + micros / 1e6 < 0.5101
            sock.sendall(b"ping")
            assert peer.recv(16) == b"ping"


def test_connect_unix_reaches_an_abstract_address() -> None:
    name = f"\0eventspool-test-{uuid.uuid4()}"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(name)
        listener.listen()
        fd = connect_unix(name, 1.0)
        peer, _ = listener.accept()
        with peer, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd) as sock:
            sock.sendall(b"ping")
            assert peer.recv(16) == b"ping"


def test_connect_unix_fails_as_socket_connect_does_and_leaves_no_descriptor(
    tmp_path: Path,
) -> None:
    _in_a_process_of_its_own("refused", tmp_path)


def test_connect_unix_to_a_full_backlog_gives_up_after_its_timeout(tmp_path: Path) -> None:
    _in_a_process_of_its_own("backlog", tmp_path)


def test_a_connections_socket_object_stays_blocking_under_a_default_timeout(
    tmp_path: Path,
) -> None:
    """The `socket.socket` made late around the descriptor ignores a process-wide
    default timeout, which would make the descriptor non-blocking under the client."""
    path = tmp_path / "agent.sock"
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(0.5)
    try:
        with listening(path) as listener:
            connection = Connection(connect_unix(str(path), 1.0), 1 << 20)
            peer, _ = listener.accept()
            with peer:
                assert connection.sock.gettimeout() is None
                assert os.get_blocking(connection.fd)
                connection.close()
                assert peer.recv(16) == b""  # closed once, through the socket object
    finally:
        socket.setdefaulttimeout(previous)


def test_request_ids_wrap_around_and_skip_zero(tmp_path: Path) -> None:
    """0 is the id of connection-level errors: after the largest id comes 1."""
    with Client(tmp_path / "agent.sock") as client:
        pipeline = client._pipeline
        pipeline._last_request_id = 0xFFFFFFFE
        assert [pipeline._next_id() for _ in range(3)] == [0xFFFFFFFF, 1, 2]
