"""A child process for `native.connect_unix`'s failures: each must raise what
`socket.connect` raises and leave no descriptor open.

The check compares the process's open descriptors before and after, which only means
something in a process whose one thread is this one: a pytest worker's leftover threads
(an agent's, librdkafka's) open and close descriptors of their own meanwhile.

Run as ``python -m tests.client.connect_failures refused DIR`` or ``backlog DIR``; it
exits 0 when every check held, or fails with the assertion's traceback.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eventspool._core.native import connect_unix


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _raises(kind: type[BaseException], call: Callable[..., object], *args: object) -> BaseException:
    try:
        call(*args)
    except kind as raised:
        return raised
    raise AssertionError(f"{call}{args} did not raise {kind.__name__}")


def refused(directory: Path) -> None:
    """A missing path, something not listening, a path too long, a name with no file
    system bytes."""
    (directory / "plain").write_bytes(b"")
    before = _open_descriptors()
    missing = _raises(FileNotFoundError, connect_unix, str(directory / "missing.sock"), 1.0)
    assert isinstance(missing, OSError) and missing.errno == errno.ENOENT and missing.strerror
    _raises(ConnectionRefusedError, connect_unix, str(directory / "plain"), 1.0)
    too_long = _raises(OSError, connect_unix, str(directory / ("x" * 200)), 1.0)
    assert "AF_UNIX path too long" in str(too_long), too_long
    _raises(UnicodeEncodeError, connect_unix, "\ud800", 1.0)  # a lone surrogate
    assert _open_descriptors() == before


def backlog(directory: Path) -> None:
    """An agent that accepts no more: the connect waits for room in its backlog for the
    timeout (SO_SNDTIMEO), then fails with EAGAIN, the descriptor closed."""
    path = str(directory / "agent.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(0)
        waiting: list[socket.socket] = []
        try:
            while True:  # fill the backlog without waiting
                sock = socket.socket(socket.AF_UNIX)
                waiting.append(sock)
                sock.setblocking(False)
                sock.connect(path)
        except BlockingIOError:
            pass
        before = _open_descriptors()
        started = time.monotonic()
        _raises(BlockingIOError, connect_unix, path, 0.3)
        waited = time.monotonic() - started
        assert 0.29 <= waited < 3, waited
        assert _open_descriptors() == before
        for sock in waiting:
            sock.close()


if __name__ == "__main__":
    {"refused": refused, "backlog": backlog}[sys.argv[1]](Path(sys.argv[2]))
