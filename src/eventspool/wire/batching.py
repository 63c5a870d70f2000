"""How a client cuts the queued events of one topic (or exchange) into SEND (PUBLISH) frames.

Both clients cut by this one rule, so the agent sees the same frames whichever client a
batch came through: no frame over the client's `max_frame_bytes`, none with more events
than the agent accepts in one request (`MAX_EVENTS_PER_SEND`).
"""

from __future__ import annotations

from eventspool._core.native import frame_cuts
from eventspool.wire.protocol import MAX_EVENTS_PER_SEND, SEND_OVERHEAD


def frame_slices(name: str, sizes: list[int], max_frame_bytes: int) -> list[slice]:
    """The events of each frame, in order, given each event's encoded size.

    `name` is the topic or exchange every frame repeats. An event larger than a frame on
    its own goes alone in one, for the agent to judge (and refuse) with the others' fate
    unaffected. Sizes, not events, come in, so the clients keep their own event types.
    The loop over them is compiled (`frame_cuts`).
    """
    overhead = SEND_OVERHEAD + len(name.encode())
    return frame_cuts(sizes, overhead, max_frame_bytes, MAX_EVENTS_PER_SEND)
