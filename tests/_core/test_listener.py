"""The compiled unix listener (`UnixIntake`) on its own thread, with real sockets.

What it answers must be spooled under the ids it answered with; at the first frame it
leaves to Python it hands the connection over with the bytes from there on and the
answers it did not write; it closes silent and slow connections, stops reading a client
that does not read, and never dies of a client's bytes. The sanitizer test runs this
file against the instrumented build.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspool._core.native import UnixIntake, decode_results
from eventspool.config import QueueSettings, SpoolSettings
from eventspool.pipeline import Spool
from eventspool.wire.protocol import (
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    encode_frame,
    encode_send,
)
from tests.wire_support import read_frames, spooled

TOPIC = "listened"
MAY_WAIT = "may-wait"
SETTINGS = SpoolSettings(max_event_bytes=4096, queue=QueueSettings(capacity_bytes=1 << 20))
TIMEOUT_S = 5.0


@dataclass
class _Counters:
    requests: int = 0
    protocol_errors: int = 0


@dataclass
class _Handed:
    fd: int
    first: bytes
    unsent: bytes
    answered: bool


@dataclass
class _Listening:
    path: str
    spool: Spool
    intake: UnixIntake
    counters: _Counters
    thread: threading.Thread
    handed: list[_Handed] = field(default_factory=list)
    failures: list[tuple[str, BaseException]] = field(default_factory=list)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(self.path)
        return sock

    def wait_handed(self, count: int) -> list[_Handed]:
        deadline = time.monotonic() + TIMEOUT_S
        while len(self.handed) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.handed


@contextmanager
def _listening(
    directory: Path, frame_timeout_s: float = 30.0, busy_poll_s: float = 50e-6
) -> Iterator[_Listening]:
    spool = Spool(directory / "spool", settings=SETTINGS)
    spool.set_partition_count(TOPIC, 2)
    counters = _Counters()
    path = str(directory / "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.setblocking(False)
    inline: set[bytes] = set()

    def learn(raw_topic: bytes) -> bool:
        if raw_topic == MAY_WAIT.encode():
            return False
        inline.add(raw_topic)
        return True

    def fallback(topic: str, value: bytes | None, key: bytes | None) -> tuple[int, bytes]:
        try:
            return Status.OK, spool.send(topic, value, key).encode()
        except Exception as exc:
            return Status.INVALID_TOPIC, str(exc).encode()

    handed: list[_Handed] = []
    failures: list[tuple[str, BaseException]] = []
    intake = UnixIntake(
        server.fileno(),
        spool,
        4096 + 1024,
        frame_timeout_s,
        inline,
        learn,
        fallback,
        lambda fd, first, unsent, answered: handed.append(_Handed(fd, first, unsent, answered)),
        counters,
        lambda what, exc: failures.append((what, exc)),
        busy_poll_s,
    )
    thread = threading.Thread(target=intake.run)
    thread.start()
    listening = _Listening(path, spool, intake, counters, thread, handed, failures)
    try:
        yield listening
    finally:
        intake.stop()
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()
        server.close()
        for taken in handed:
            os.close(taken.fd)
        spool.close()
    assert failures == []


@pytest.mark.parametrize("busy_poll_s", [0.0, 50e-6])
def test_sends_and_pings_are_answered_and_spooled_under_their_ids(
    tmp_path: Path, busy_poll_s: float
) -> None:
    with _listening(tmp_path, busy_poll_s=busy_poll_s) as listening, listening.connect() as sock:
        answered: list[tuple[str, tuple[bytes | None, bytes]]] = []
        for request_id in range(1, 51):
            key = None if request_id % 3 else b"k%d" % request_id
            value = b"v%d" % request_id
            sock.sendall(encode_send(request_id, TOPIC, [WireEvent(value, key)]))
            (answer,) = read_frames(sock, 1)
            assert (answer.type, answer.request_id) == (FrameType.SEND_RESULT, request_id)
            (event_id,) = decode_results(answer.body)
            assert isinstance(event_id, str)
            answered.append((event_id, (key, value)))
        sock.sendall(encode_frame(FrameType.PING, 99, b"are you there"))
        (pong,) = read_frames(sock, 1)
        assert (pong.type, pong.request_id, pong.body) == (FrameType.PONG, 99, b"are you there")
        in_rings = spooled(listening.spool)
        assert [in_rings[event_id] for event_id, _ in answered] == [e for _, e in answered]
        assert listening.counters.requests == 50
        assert listening.intake.connections == 1


def _thread_cpu_s(thread: threading.Thread) -> float:
    """CPU time `thread` has used: its own CPU-time clock."""
    assert thread.ident is not None and thread.is_alive(), "a running thread's clock"
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def test_a_busy_polling_listener_goes_quiet_when_its_clients_do(tmp_path: Path) -> None:
    """Busy polling (busy_poll.pxi) spins only while requests follow each other closely:
    once they stop, the listener's thread blocks and takes no CPU. A long budget makes a
    spin that never ends plain within the idle second (the backoff, shared with the
    client, is tested there: tests/client/test_busy_poll.py)."""
    with _listening(tmp_path, busy_poll_s=0.01) as listening, listening.connect() as sock:
        for request_id in range(1, 201):
            sock.sendall(encode_frame(FrameType.PING, request_id, b""))
            read_frames(sock, 1)
        time.sleep(0.1)  # the last spin runs out
        before = _thread_cpu_s(listening.thread)
        time.sleep(1.0)
        assert _thread_cpu_s(listening.thread) - before < 0.1


def test_a_frame_in_pieces_is_answered_once_whole(tmp_path: Path) -> None:
    frames = encode_send(1, TOPIC, [WireEvent(b"x" * 300)]) + encode_frame(FrameType.PING, 2, b"")
    with _listening(tmp_path) as listening, listening.connect() as sock:
        for cut in range(0, len(frames), 37):
            sock.sendall(frames[cut : cut + 37])
            time.sleep(0.002)
        answers = read_frames(sock, 2)
        assert [(f.type, f.request_id) for f in answers] == [
            (FrameType.SEND_RESULT, 1),
            (FrameType.PONG, 2),
        ]


def test_the_first_frame_left_to_python_hands_the_connection_over(tmp_path: Path) -> None:
    """With the answers not written yet, so that the server writes them in order."""
    first = encode_send(1, TOPIC, [WireEvent(b"a")])
    rest = encode_frame(FrameType.STATS, 2, b"") + encode_send(3, TOPIC, [WireEvent(b"b")])
    with _listening(tmp_path) as listening, listening.connect() as sock:
        sock.sendall(first + rest)
        (handed,) = listening.wait_handed(1)
        assert (handed.first, handed.answered) == (rest, True)
        (answer,) = FrameDecoder().feed(handed.unsent)
        assert (answer.type, answer.request_id) == (FrameType.SEND_RESULT, 1)
        assert listening.intake.connections == 0
        # The descriptor is the server's now: the listener reads it no more.
        os.write(handed.fd, encode_frame(FrameType.PONG, 7, b"from the server"))
        (pong,) = read_frames(sock, 1)
        assert pong.request_id == 7


def test_http_and_topics_that_may_wait_are_handed_over_unread(tmp_path: Path) -> None:
    http = b"POST /v1/topics/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    waits = encode_send(1, MAY_WAIT, [WireEvent(b"a")])
    with _listening(tmp_path) as listening, listening.connect() as web:
        web.sendall(http)
        with listening.connect() as waiting:
            waiting.sendall(waits)
            handed = listening.wait_handed(2)
            assert sorted((h.first, h.unsent, h.answered) for h in handed) == sorted(
                [(http, b"", False), (waits, b"", False)]
            )


def test_silent_and_slow_connections_are_closed(tmp_path: Path) -> None:
    with _listening(tmp_path, frame_timeout_s=0.3) as listening:
        with listening.connect() as silent, listening.connect() as slow:
            slow.sendall(encode_send(1, TOPIC, [WireEvent(b"a")])[:10])
            started = time.monotonic()
            assert silent.recv(16) == b""
            assert slow.recv(16) == b""
            assert time.monotonic() - started < 2.0
        assert listening.counters.protocol_errors == 1
        with listening.connect() as fine:  # and the listener goes on
            fine.sendall(encode_frame(FrameType.PING, 1, b""))
            assert read_frames(fine, 1)[0].type is FrameType.PONG


PING = encode_frame(FrameType.PING, 1, b"p" * 3000)


def _write_until_blocked(sock: socket.socket) -> int:
    """PINGs (answered in full) written until the socket takes no more: the bytes taken."""
    sock.setblocking(False)
    written = 0
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            written += sock.send(PING)
        except BlockingIOError:
            time.sleep(0.05)
            try:
                written += sock.send(PING)
            except BlockingIOError:
                sock.setblocking(True)
                return written
    raise AssertionError("the listener kept reading a client that reads nothing")


def test_a_client_that_does_not_read_is_not_read_either(tmp_path: Path) -> None:
    """PINGs answered in full would buffer their echoes without end: the listener stops
    reading while its answers wait for room, so the client's writes block."""
    with _listening(tmp_path) as listening, listening.connect() as sock:
        whole = _write_until_blocked(sock) // len(PING)
        answers = read_frames(sock, whole)
        assert all(f.body == b"p" * 3000 for f in answers)


def test_answers_not_written_when_it_stops_are_handed_over(tmp_path: Path) -> None:
    """They answer events already spooled: the server writes them before it closes."""
    with _listening(tmp_path) as listening:
        sock = listening.connect()
        _write_until_blocked(sock)
    with sock:
        (handed,) = listening.handed
        assert (handed.first, handed.answered) == (b"", True)
        assert handed.unsent


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=400), prefix=st.booleans())
def test_random_bytes_never_crash_the_listener(
    tmp_path_factory: object, data: bytes, prefix: bool
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")  # type: ignore[attr-defined]
    if prefix:
        data = encode_send(1, TOPIC, [WireEvent(b"v")]) + data
    with _listening(directory, frame_timeout_s=0.2) as listening:
        with listening.connect() as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.05)
            decoder = FrameDecoder()
            deadline = time.monotonic() + TIMEOUT_S
            while not listening.handed:  # or until the listener closes it
                assert time.monotonic() < deadline, "neither answered, closed nor handed over"
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                decoder.feed(chunk)
        with listening.connect() as after:
            after.sendall(encode_frame(FrameType.PING, 1, b""))
            assert read_frames(after, 1)[0].type is FrameType.PONG


def test_out_of_descriptors_pauses_accepting_and_loses_no_connection(tmp_path: Path) -> None:
    """accept() failing with EMFILE is reported, accepting pauses for a second (as in
    asyncio's servers), and every connection that waited is served once descriptors are
    free again."""
    with _listening(tmp_path) as listening:
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(8)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        holes: list[int] = []
        try:
            with contextlib.suppress(OSError):  # every free number below the limit taken
                while True:
                    holes.append(os.dup(0))
            for client in clients:  # connecting takes no new descriptor here
                client.settimeout(TIMEOUT_S)
                client.connect(listening.path)
            deadline = time.monotonic() + TIMEOUT_S
            while not listening.failures and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            for fd in holes:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        ((what, exc),) = listening.failures
        assert what == "accepting a connection"
        assert isinstance(exc, OSError) and exc.errno == errno.EMFILE
        listening.failures.clear()
        for number, client in enumerate(clients):
            with client:
                client.sendall(encode_frame(FrameType.PING, number, b""))
                assert read_frames(client, 1)[0].request_id == number
