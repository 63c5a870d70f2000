"""Per-queue bookkeeping of records sent and acknowledged by the broker.

The read position may move only to the end of the longest prefix the broker has
acknowledged: a record acknowledged after a gap waits for the gap to close. The tracker
is compiled (eventspool._core.native), since every delivery report updates it.
"""

from __future__ import annotations

from eventspool._core.native import AckTracker

__all__ = ["AckTracker"]
