"""The fault proxy on its own, against an echo server: the broker tests trust what it does."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from eventspool.testing.proxy import FaultProxy

_TIMEOUT_S = 5.0


class _EchoServer:
    """Echoes every byte back on each connection, one thread per connection."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        # shutdown() wakes the blocked accept(); close() alone does not on Linux.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(_TIMEOUT_S)


@pytest.fixture
def echo() -> Iterator[_EchoServer]:
    server = _EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: _EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as fault_proxy:
        yield fault_proxy


def _connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=_TIMEOUT_S)
    sock.settimeout(_TIMEOUT_S)
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(65536, size - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _is_closed_by_peer(sock: socket.socket) -> bool:
    """True when the next read sees EOF or a reset, False when the connection still works."""
    try:
        sock.sendall(b"ping")
        return sock.recv(4) != b"ping"
    except (ConnectionResetError, BrokenPipeError):
        return True


def _dropped_on_arrival(proxy: FaultProxy) -> bool:
    """True when a new connection is closed at once (the reset may even beat connect())."""
    try:
        sock = _connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        return _is_closed_by_peer(sock)


def test_bytes_flow_both_ways_unchanged(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        sock.sendall(b"hello")
        assert _recv_exactly(sock, 5) == b"hello"
    assert proxy.accepted == 1


def test_large_transfer_keeps_every_byte_in_order(proxy: FaultProxy) -> None:
    """Several MiB in flight at once exercise the backpressure between the two sides."""
    payload = os.urandom(6 * 1024 * 1024)
    with _connect(proxy) as sock:
        writer = threading.Thread(target=sock.sendall, args=(payload,))
        writer.start()
        received = _recv_exactly(sock, len(payload))
        writer.join(_TIMEOUT_S)
    assert received == payload


def test_cut_closes_open_connections_and_refuses_new_ones_until_restore(
    proxy: FaultProxy, echo: _EchoServer
) -> None:
    first, second = _connect(proxy), _connect(proxy)
    try:
        assert not _is_closed_by_peer(first)
        assert not _is_closed_by_peer(second)
        assert proxy.open_connections == 2

        proxy.cut()
        assert proxy.is_cut
        assert proxy.open_connections == 0
        assert _is_closed_by_peer(first)
        assert _is_closed_by_peer(second)

        connections_before = echo.connections
        assert _dropped_on_arrival(proxy)
        assert proxy.refused == 1
        assert echo.connections == connections_before, "a cut connection reached the target"

        proxy.restore()
        with _connect(proxy) as after:
            assert not _is_closed_by_peer(after)
    finally:
        first.close()
        second.close()


def test_target_down_closes_the_client(echo: _EchoServer) -> None:
    echo.close()
    with FaultProxy("127.0.0.1", echo.port) as proxy:
        assert _dropped_on_arrival(proxy)
        assert proxy.failed == 1


def test_client_eof_closes_the_target_side(proxy: FaultProxy) -> None:
    sock = _connect(proxy)
    assert not _is_closed_by_peer(sock)
    sock.close()
    deadline = time.monotonic() + _TIMEOUT_S
    while proxy.open_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.open_connections == 0


def test_close_stops_listening_and_is_idempotent(echo: _EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port)
    open_sock = _connect(proxy)
    proxy.close()
    proxy.close()
    with open_sock:
        assert _is_closed_by_peer(open_sock)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=_TIMEOUT_S).close()
    with pytest.raises(RuntimeError, match="closed"):
        proxy.cut()
