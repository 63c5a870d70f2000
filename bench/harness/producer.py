"""The anchor's producer settings: what the sender gives its own `confluent_kafka.Producer`,
so that a comparison with a bare producer measures design, not settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventspool.config import SenderSettings, SpoolSettings
from eventspool.sender.producer import producer_config


def sender_producer_config(bootstrap: str) -> dict[str, object]:
    """The sender's own producer settings, on the SenderSettings defaults."""
    return producer_config(bootstrap, SenderSettings(), SpoolSettings().max_event_bytes)


def anchor_config(bootstrap: str, on_error: Callable[[Any], None]) -> dict[str, object]:
    """The sender's producer settings, keys partitioned where the spool puts them."""
    return {
        **sender_producer_config(bootstrap),
        "partitioner": "murmur2_random",
        "error_cb": on_error,
    }


def compared_settings() -> dict[str, object]:
    """Both sides' settings for a result: the spool's queue defaults, the anchor's config."""
    queue = SpoolSettings().queue
    anchor = anchor_config("BOOTSTRAP", print)
    return {
        "spool": {
            "durability": queue.durability.value,
            "capacity_bytes_per_queue": queue.capacity_bytes,
            "segment_bytes": queue.segment_bytes,
            "full_policy": queue.full_policy.value,
        },
        "anchor_producer": {key: value for key, value in anchor.items() if not callable(value)},
    }
