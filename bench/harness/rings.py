"""Emptying a spool that has no sender, between timed passes and outside them.

A bench of the application's side of `Spool.send()` runs without a sender: each pass must
fit in the rings, which are emptied between passes and the count checked.
"""

from __future__ import annotations

from eventspool.config import MIB
from eventspool.envelope import FIXED_SIZE
from eventspool.pipeline import Spool
from eventspool.spool.ring import frame_size


def empty_rings(spool: Spool) -> int:
    """Read and acknowledge everything in every ring of `spool`; the record count."""
    drained = 0
    for ref in spool.queues():
        ring = ref.ring
        while batch := ring.read_batch(max_records=10_000, max_bytes=64 * MIB):
            ring.ack(batch[-1].seq)
            drained += len(batch)
    return drained


def expect_emptied(spool: Spool, sent: int) -> None:
    """Empty `spool`'s rings and check that they held exactly the `sent` records."""
    drained = empty_rings(spool)
    if drained != sent:
        raise RuntimeError(f"sent {sent} records but drained {drained} from the spool")


def fitting_events(rings: int, capacity_bytes: int, record_bytes: int) -> int:
    """Records of `record_bytes` (envelope excluded) a pass may send without a drainer:
    half of what `rings` rings of `capacity_bytes` hold, so none ever refuses one."""
    return rings * capacity_bytes // (2 * frame_size(FIXED_SIZE + record_bytes))
