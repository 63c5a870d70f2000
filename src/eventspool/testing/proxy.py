"""A fault-injecting TCP proxy: forwards to one target until told to cut.

`cut()` closes every open connection at once and, until `restore()`, accepts each new
connection only to close it straight away, the way a client sees a broker that died
and keeps dying. One selector thread serves every connection, with a bounded buffer
per direction, so a slow reader slows its writer instead of growing memory.

Kafka clients connect to the address the broker *advertises*, not to the one they were
bootstrapped with: put the proxy in front of a broker that advertises the proxy's port,
or the client will go around it after its first metadata request.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

__all__ = ["FaultProxy"]

_CHUNK = 65536
_MAX_BUFFERED = 1 << 20
_CONNECT_TIMEOUT_S = 2.0
_COMMAND_TIMEOUT_S = 10.0


@dataclass(eq=False, slots=True)
class _End:
    """One socket of a proxied connection, with the bytes still owed to it."""

    sock: socket.socket
    peer: _End | None = None
    outbound: bytearray = field(default_factory=bytearray)
    reading: bool = True  # False once this side sent EOF
    close_when_flushed: bool = False  # the other side sent EOF: close after `outbound`
    mask: int = 0  # selector events registered for `sock`; 0 when unregistered


class FaultProxy:
    """Forward 127.0.0.1:`port` to `target_host`:`target_port`; see the module docstring."""

    def __init__(
        self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, 0))
        self._listener.setblocking(False)
        self.host: str = listen_host
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0  # connections forwarded to the target
        self.refused = 0  # connections closed on arrival because of a cut
        self.failed = 0  # connections closed because the target refused them
        self._cut = False
        self._closed = False
        self.error: BaseException | None = None  # what killed the selector thread, if anything
        self._ends: set[_End] = set()
        self._lock = threading.Lock()
        self._commands: list[tuple[str, threading.Event]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}")
        self._thread.daemon = True
        self._thread.start()

    @property
    def address(self) -> str:
        """host:port of the proxy, as a Kafka bootstrap string."""
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def open_connections(self) -> int:
        """Proxied connections currently open (each counts once, not per socket)."""
        with self._lock:
            return sum(1 for end in self._ends if end.peer is not None) // 2

    def cut(self) -> None:
        """Close every open connection and drop new ones until `restore()`; returns once done."""
        self._command("cut")

    def restore(self) -> None:
        """Forward new connections again (connections closed by the cut stay closed)."""
        self._command("restore")

    def close(self) -> None:
        """Close every connection and the listening socket; idempotent."""
        if self._closed:
            return
        if self._thread.is_alive():
            self._command("close")
        self._thread.join(_COMMAND_TIMEOUT_S)
        self._closed = True
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ---- the selector thread owns every socket; other threads only send commands ----

    def _command(self, name: str) -> None:
        """Run `name` on the selector thread and wait for it, so no socket is shared."""
        if self._closed:
            raise RuntimeError(f"proxy on port {self.port} is closed")
        done = threading.Event()
        with self._lock:
            self._commands.append((name, done))
        self._wake_w.send(b"x")
        if not done.wait(_COMMAND_TIMEOUT_S):
            if self.error is not None:
                raise RuntimeError(f"proxy on port {self.port} failed") from self.error
            raise RuntimeError(f"proxy on port {self.port} did not run {name!r} in time")

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            self.error = exc
            raise

    def _loop(self) -> None:
        running = True
        while running:
            for key, events in self._selector.select():
                if key.data == "listener":
                    self._accept()
                elif key.data == "wake":
                    running = self._run_commands()
                    if not running:
                        break
                else:
                    end: _End = key.data
                    if events & selectors.EVENT_READ:
                        self._read(end)
                    if events & selectors.EVENT_WRITE and end in self._ends:
                        self._write(end)

    def _run_commands(self) -> bool:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        with self._lock:
            commands, self._commands = self._commands, []
        running = True
        for name, done in commands:
            if name == "cut":
                self._cut = True
                self._close_all()
            elif name == "restore":
                self._cut = False
            elif name == "close":
                self._close_all()
                self._selector.unregister(self._listener)
                self._listener.close()
                running = False
            done.set()
        return running

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._cut:
            self.refused += 1
            _abort(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT_S)
        except OSError:
            self.failed += 1
            _abort(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a, b = _End(client), _End(upstream)
        a.peer, b.peer = b, a
        with self._lock:
            self._ends.update((a, b))
        self._update_interest(a)
        self._update_interest(b)
        self.accepted += 1

    def _read(self, end: _End) -> None:
        peer = end.peer
        if peer is None:
            return
        try:
            data = end.sock.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._close_pair(end)
            return
        if not data:
            # Kafka never half-closes: close both once the peer has all bytes owed to it.
            if not peer.outbound:
                self._close_pair(end)
                return
            end.reading = False
            peer.close_when_flushed = True
            self._update_interest(end)
            return
        peer.outbound += data
        self._write(peer)

    def _write(self, end: _End) -> None:
        if end.outbound:
            try:
                sent = end.sock.send(end.outbound)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close_pair(end)
                return
            del end.outbound[:sent]
        if not end.outbound and end.close_when_flushed:
            self._close_pair(end)
            return
        self._update_interest(end)
        if end.peer is not None:
            self._update_interest(end.peer)  # its reading may resume now the backlog shrank

    def _update_interest(self, end: _End) -> None:
        """Read while the peer's backlog is small (backpressure); write while bytes are owed."""
        peer = end.peer
        if peer is None:
            return
        mask = 0
        if end.reading and len(peer.outbound) < _MAX_BUFFERED:
            mask |= selectors.EVENT_READ
        if end.outbound:
            mask |= selectors.EVENT_WRITE
        if mask == end.mask:
            return
        if end.mask == 0:
            self._selector.register(end.sock, mask, end)
        elif mask == 0:
            self._selector.unregister(end.sock)
        else:
            self._selector.modify(end.sock, mask, end)
        end.mask = mask

    def _close_pair(self, end: _End) -> None:
        peer = end.peer
        self._discard(end, abort=False)
        if peer is not None:
            self._discard(peer, abort=False)

    def _close_all(self) -> None:
        with self._lock:
            ends = list(self._ends)
        for end in ends:
            self._discard(end, abort=True)

    def _discard(self, end: _End, *, abort: bool) -> None:
        with self._lock:
            self._ends.discard(end)
        if end.mask:
            self._selector.unregister(end.sock)
            end.mask = 0
        if abort:
            _abort(end.sock)
        else:
            end.sock.close()
        end.peer = None


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a crashed peer's kernel would for unread data."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
