"""What tests of the agent's wire share: answers read off a socket, events read off a spool,
and a scripted peer for the clients to meet."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eventspool.envelope import decode
from eventspool.pipeline import Spool
from eventspool.wire.protocol import Frame, FrameDecoder


def read_frames(sock: socket.socket, count: int) -> list[Frame]:
    """The next `count` frames (or more, if the last read held more) the agent wrote."""
    decoder = FrameDecoder()
    frames: list[Frame] = []
    while len(frames) < count:
        data = sock.recv(1 << 16)
        assert data, "the agent closed the connection"
        frames.extend(decoder.feed(data))
    return frames


def spooled(spool: Spool) -> dict[str, tuple[bytes | None, bytes | None]]:
    """Every event in the spool's queues: (key, value) by event id."""
    found = {}
    for ref in spool.queues():
        for record in ref.ring.read_batch(10_000, 1 << 24):
            event = decode(record.payload)
            found[event.event_id] = (event.key, event.value)
    return found


def listening(path: Path) -> socket.socket:
    """A unix socket listening at `path` that the test accepts on, or never does."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    return listener


def scripted_agent(path: Path, answer: Callable[[Frame], list[bytes]]) -> threading.Thread:
    """A peer on a real unix socket that answers each request with `answer`'s chunks,
    written one by one 50 ms apart: what a real agent never does on its own (answers
    cut across reads, wrong ids, wrong counts), for the client to meet."""
    listener = listening(path)

    def serve() -> None:
        with listener, listener.accept()[0] as peer:
            decoder = FrameDecoder()
            while data := peer.recv(65536):
                for frame in decoder.feed(data):
                    for chunk in answer(frame):
                        time.sleep(0.05)
                        peer.sendall(chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread
