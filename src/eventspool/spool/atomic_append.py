"""One event into several queues, all or none: the spool's write to many topics at once."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

from eventspool.errors import SpoolClosedError, SpoolFullError
from eventspool.spool.ring import RingQueue, frame_size
from eventspool.spool.segments import SegmentedQueue


def append_to_each(queues: Sequence[SegmentedQueue], payload: bytes, timestamp_ms: int) -> None:
    """Append one payload to every queue, or to none of them; returns once all are durable.

    The write segments' locks are taken, in the order given, before anything is written;
    the record is written only when each has room for it. A queue without room makes
    room with every lock let go (a new segment, or its policy: SpoolFullError under
    `reject`, a wait under `block`, a dropped segment under `drop_oldest`), and
    everything is checked again. Callers pass the queues in one global order (the spool
    sorts by topic), or two concurrent calls could deadlock.

    A crash in the middle of the writes may leave the record in some queues only: the
    call never returned, so nobody was told it succeeded.
    """
    length = len(payload)
    size = frame_size(length)
    for queue in queues:
        if not 0 < length <= queue.write_core.max_payload:
            raise queue.writer.bad_length(length)
    deadlines: dict[SegmentedQueue, float | None] = {}
    while True:
        full: tuple[SegmentedQueue, RingQueue] | None = None
        writers = [queue.writer for queue in queues]
        with ExitStack() as held:
            for ring in writers:
                ring.core.acquire()
                held.callback(ring.core.release)
            for queue, ring in zip(queues, writers, strict=True):
                if ring.core.closed:
                    raise SpoolClosedError(f"queue {queue.path} is closed")
                if not (ring.core.fits_locked(size) or ring.core.drop_oldest):
                    full = (queue, ring)
                    break
            else:
                seqs = [ring.core.write_locked(payload, timestamp_ms) for ring in writers]
        if full is None:
            break
        queue, ring = full
        try:
            deadlines[queue] = queue.make_room(ring, size, deadlines.get(queue))
        except SpoolFullError as exc:
            raise SpoolFullError(
                f"queue {queue.where} is full (policy {queue.settings.full_policy.value}): "
                f"the event was written to none of its {len(queues)} queues"
            ) from exc
    for ring, seq in zip(writers, seqs, strict=True):
        ring.wait_durable(seq)
