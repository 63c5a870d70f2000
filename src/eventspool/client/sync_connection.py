"""One blocking socket to the agent: opening it, TLS on memory buffers, the greeting, and
what awaits an answer on it.

"tcp://host:port" reaches an agent's TCP listener, with TLS when given `ssl_context` and
presenting `token` (AUTH) when given one. TLS runs on memory buffers over the same
socket, so writing and reading keep the client's scheme. A TCP connection is
used only once the agent answered its AUTH (or a PING): a refused certificate or token,
or a plaintext client at a TLS listener, fails the calls that connect with the reason
(ForbiddenError for a token, AgentError otherwise), never leaving a request of unknown
outcome.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import threading

from eventspool._core.native import ConnectionCore, block_with_timeout
from eventspool.client.common import Greeting, Target, greeting_failure
from eventspool.errors import AgentError
from eventspool.wire.protocol import Frame, FrameDecoder, ProtocolError

#: The most bytes one read takes from the socket. Below glibc's mmap threshold (128 KiB),
#: so what a read allocates comes from the heap: a 256 KiB `recv` cost an mmap, an mremap
#: and a munmap per answer in a fresh process (about 20 us of CPU per send, measured).
READ_SIZE = 64 * 1024


class Tls:
    """TLS on memory buffers: the client writes and reads the socket itself, as without
    TLS. The writer seals (under the writer role) and the reader opens; one lock keeps
    them from using the TLS state at once."""

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self._lock = threading.Lock()

    def handshake(self, sock: socket.socket) -> None:
        """The handshake, on the connecting caller's blocking socket."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                sock.sendall(self._outgoing.read())
                data = sock.recv(READ_SIZE)
                if not data:
                    raise ConnectionResetError from None
                self._incoming.write(data)
            else:
                sock.sendall(self._outgoing.read())
                return

    def seal(self, data: bytes) -> bytes:
        """The records that carry `data`, and any the reader's work left to send."""
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[self._tls.write(view) :]
            return self._outgoing.read()

    def open(self, data: bytes) -> bytes:
        """What the whole records received so far carry; b"" until one is complete.

        After the agent's close_notify there is nothing more to read (the socket's end
        of file follows), but what came before it is returned.
        """
        with self._lock:
            self._incoming.write(data)
            parts = []
            while True:
                try:
                    chunk = self._tls.read(READ_SIZE)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    break
                if not chunk:  # the close_notify, once received
                    break
                parts.append(chunk)
            return b"".join(parts)


class Connection(ConnectionCore):
    """One socket to the agent (its descriptor `fd`, the largest frame taken from it
    `max_frame`, and `tls`), what awaits an answer on it, and who reads it now (the part
    a `send()` alone reads and sets is compiled: `ConnectionCore`)."""

    @functools.cached_property
    def sock(self) -> socket.socket:
        """Made on the first use: a call in person writes and reads `fd` itself, and
        `connect_unix` makes none."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=self.fd)
        if sock.gettimeout() is not None:  # socket.setdefaulttimeout() was called
            sock.settimeout(None)
        return sock

    @functools.cached_property
    def decoder(self) -> FrameDecoder:
        """Made on the first use: a short-lived client's call in person needs none."""
        return FrameDecoder(self.max_frame)

    def close(self) -> None:
        """Close the socket, through its `socket.socket` if one was made; once."""
        sock: socket.socket | None = self.__dict__.get("sock")
        if sock is None:
            os.close(self.fd)
        else:
            sock.close()


def connect_tcp(target: Target, max_frame: int, request_id: int, timeout: float) -> Connection:
    """A TCP connection to the agent, greeted (`greet`), its reads and writes bounded
    by `timeout`. Raises OSError when the agent cannot be reached."""
    sock = socket.create_connection((target.host, target.port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _block_with_timeout(sock, timeout)
        return greet(sock, target, max_frame, request_id, timeout)
    except BaseException:
        sock.close()
        raise


def greet(
    sock: socket.socket, target: Target, max_frame: int, request_id: int, timeout: float
) -> Connection:
    """The TLS handshake, then AUTH with the token (or else a PING), answered before
    anything is sent: raises ForbiddenError for a refused token, AgentError when TLS
    fails or the agent hangs up."""
    where = f"agent at {target.text}"
    tls = None if target.ssl_context is None else Tls(target.ssl_context, target.host)
    connection = Connection(sock.fileno(), max_frame, tls)
    connection.sock = sock
    greeting = Greeting.for_target(target, request_id)
    try:
        data = greeting.frame
        if tls is not None:
            tls.handshake(sock)
            data = tls.seal(data)
        sock.sendall(data)
        frames: list[Frame] = []
        while not frames:
            data = sock.recv(READ_SIZE)
            if not data:
                raise ConnectionResetError
            frames = connection.decoder.feed(data if tls is None else tls.open(data))
    except BlockingIOError:  # SO_RCVTIMEO or SO_SNDTIMEO ran out
        raise AgentError(f"{where}: no answer within {timeout} s") from None
    except (OSError, ProtocolError) as exc:  # ssl.SSLError and resets are OSErrors
        raise greeting_failure(exc, where, tls=tls is not None) from None
    greeting.check(frames[0], where)
    return connection


def receive(connection: Connection) -> bytes:
    """The next bytes from the agent (b"" at its end of file), read into the
    connection's buffer and copied out at their own size."""
    buffer = connection.buffer
    if buffer is None:
        buffer = connection.buffer = bytearray(READ_SIZE)
    got = connection.sock.recv_into(buffer)
    return bytes(memoryview(buffer)[:got])


def write_now(connection: Connection, data: bytes) -> int:
    """Bytes of `data` the socket took without waiting."""
    try:
        return connection.sock.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0


def _block_with_timeout(sock: socket.socket, timeout: float) -> None:
    """Blocking reads and writes that give up after `timeout` (SO_RCVTIMEO, SO_SNDTIMEO).

    Not Python's socket timeout: that polls before each recv, and a reader woken from
    poll() answers 40 us later than one woken from recv() (measured on a 2-core VM: 80
    against 40 us for a ping to a process that answers at once). A write that must
    not wait sends with MSG_DONTWAIT.
    """
    if sock.gettimeout() is not None:
        sock.settimeout(None)
    block_with_timeout(sock.fileno(), timeout)
