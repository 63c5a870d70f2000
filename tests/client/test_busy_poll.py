"""A blocking `send()` alone on its connection busy-polls for its answer before it blocks
(busy_poll.pxi): a wait that meets nothing makes the next 1, 2, 4 ... 64 block at once,
and one that meets its answer lets the next spin again. Against a peer on a real unix
socket that answers a call before it is made (the answer waits in the socket, so the
first try meets it) or well after the spin ran out.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventspool.client.sync import AgentError, Client
from eventspool.wire.protocol import EventResult, FrameDecoder, Status, encode_send_result
from tests.wire_support import listening

LATE_S = 0.2  # an answer this late misses any spin of these tests, however loaded


class Peer:
    """Answers the calls it was told are late, LATE_S after it read them; the test
    writes the other answers itself before their calls."""

    def __init__(self, path: Path) -> None:
        self.listener = listening(path)
        self.connected = threading.Event()
        self.late: set[int] = set()
        self.connection: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener, self.listener.accept()[0] as peer:
            self.connection = peer
            self.connected.set()
            decoder = FrameDecoder()
            while data := peer.recv(65536):
                for frame in decoder.feed(data):
                    if frame.request_id in self.late:
                        time.sleep(LATE_S)
                        peer.sendall(_answer(frame.request_id))

    def answer_ahead(self, request_id: int) -> None:
        assert self.connection is not None
        self.connection.sendall(_answer(request_id))


def _answer(request_id: int) -> bytes:
    return encode_send_result(request_id, [EventResult(Status.OK, _event_id(request_id))])


def _event_id(request_id: int) -> str:
    return f"00000000-0000-7000-8000-{request_id:012d}"


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Peer]:
    peer = Peer(tmp_path / "agent.sock")
    yield peer
    peer.listener.close()


def _call(client: Client, peer: Peer, *, late: bool) -> None:
    """One `send()`, its answer late or written ahead; checks it got its own event_id."""
    request_id = client._pipeline._last_request_id + 1
    if late:
        peer.late.add(request_id)
    else:
        peer.connected.wait(5)
        peer.answer_ahead(request_id)
    assert client.send("orders", b"x") == _event_id(request_id)


def test_a_missed_spin_backs_the_next_waits_off_and_a_met_answer_ends_the_backoff(
    peer: Peer, tmp_path: Path
) -> None:
    with Client(tmp_path / "agent.sock", busy_poll_us=1000) as client:
        skips: list[int] = []
        for late in (True, False, True, False, False, False, True):
            _call(client, peer, late=late)
            skips.append(client._pipeline._busy_poll_skip)
    # late: a miss, 1 skipped; late again: 2 skipped; the one after meets its answer
    # ahead, so the last late call's miss backs off from 1 again.
    assert skips == [1, 0, 2, 1, 0, 0, 1]


def test_the_backoff_doubles_up_to_64_waits(peer: Peer, tmp_path: Path) -> None:
    with Client(tmp_path / "agent.sock", busy_poll_us=100) as client:
        after_misses: list[int] = []
        while len(after_misses) < 8:
            spins = client._pipeline._busy_poll_skip == 0
            _call(client, peer, late=spins)  # a call that spins misses; the others block
            if spins:
                after_misses.append(client._pipeline._busy_poll_skip)
    assert after_misses == [1, 2, 4, 8, 16, 32, 64, 64]


def test_no_busy_poll_blocks_at_once(peer: Peer, tmp_path: Path) -> None:
    with Client(tmp_path / "agent.sock", busy_poll_us=0) as client:
        for late in (True, True, False):
            _call(client, peer, late=late)
            assert client._pipeline._busy_poll_skip == 0
        assert client.busy_poll_us == 0


def test_a_spin_keeps_the_timeout(tmp_path: Path) -> None:
    """A peer that never answers: the call fails after its timeout, spin or not."""
    listener = listening(tmp_path / "agent.sock")
    with listener, Client(tmp_path / "agent.sock", timeout=0.3, busy_poll_us=10_000) as client:
        started = time.monotonic()
        with pytest.raises(AgentError):
            client.send("orders", b"x")
        assert time.monotonic() - started < 0.3 + 0.01 + 1.5


@pytest.mark.parametrize("value", [-1.0, 10_000.5, math.nan, math.inf])
def test_busy_poll_out_of_range_is_refused_in_words(value: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"busy_poll_us=.*must be from 0 to 10000 microseconds"):
        Client(tmp_path / "agent.sock", busy_poll_us=value)
    client = Client(tmp_path / "agent.sock")
    with pytest.raises(ValueError, match="busy_poll_us"):
        client.busy_poll_us = value
    assert client.busy_poll_us == pytest.approx(50)
    client.busy_poll_us = 10_000
    assert client.busy_poll_us == pytest.approx(10_000)


@pytest.mark.parametrize("busy_poll_us", [0, 10_000])
def test_a_reset_connection_fails_the_call_with_its_error(
    busy_poll_us: float, tmp_path: Path
) -> None:
    """A peer that closes with the request unread resets the connection: the read that
    meets the reset reports it, spinning or not, where a blocking read after it would
    see only an end of file."""
    listener = listening(tmp_path / "agent.sock")

    def reset() -> None:
        with listener, listener.accept()[0] as peer:
            peer.settimeout(5)
            peer.recv(1, socket.MSG_PEEK)  # the request arrived, and stays unread

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    with (
        Client(tmp_path / "agent.sock", busy_poll_us=busy_poll_us) as client,
        pytest.raises(AgentError, match="Connection reset by peer"),
    ):
        client.send("orders", b"x")
    thread.join(5)
