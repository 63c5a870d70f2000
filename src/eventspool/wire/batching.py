"""How a client cuts the queued events of one topic (or exchange) into SEND (PUBLISH) frames.

Both clients cut by this one rule, so the agent sees the same frames whichever client a
batch came through: no frame over the client's `max_frame_bytes`, none with more events
than the agent accepts in one request (`MAX_EVENTS_PER_SEND`).
"""

from __future__ import annotations

from collections.abc import Sequence

from eventspool.wire.protocol import MAX_EVENTS_PER_SEND, SEND_OVERHEAD


def frame_slices(name: str, sizes: Sequence[int], max_frame_bytes: int) -> list[slice]:
    """The events of each frame, in order, given each event's encoded size.

    `name` is the topic or exchange every frame repeats. An event larger than a frame on
    its own goes alone in one, for the agent to judge (and refuse) with the others' fate
    unaffected. Sizes, not events, come in, so the clients keep their own event types.
    """
    overhead = SEND_OVERHEAD + len(name.encode())
    slices: list[slice] = []
    start = 0
    size = overhead
    for index, event_size in enumerate(sizes):
        if index > start and (
            size + event_size > max_frame_bytes or index - start >= MAX_EVENTS_PER_SEND
        ):
            slices.append(slice(start, index))
            start, size = index, overhead
        size += event_size
    if start < len(sizes):
        slices.append(slice(start, len(sizes)))
    return slices
