"""What tests of the agent's wire share: answers read off a socket, events read off a spool."""

from __future__ import annotations

import socket

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
