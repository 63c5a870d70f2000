"""The anchor's producer settings: what the sender gives its own `confluent_kafka.Producer`.

An anchor that is a bare producer must be configured as ours is, or the comparison
measures settings, not design.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eventspool.config import SenderSettings, SpoolSettings
from eventspool.sender.producer import producer_config


def sender_producer_config(bootstrap: str) -> dict[str, object]:
    """The settings the sender gives its own producer (eventspool.sender.producer), with
    the SenderSettings defaults: what an anchor's bare `confluent_kafka.Producer` uses."""
    return producer_config(bootstrap, SenderSettings(), SpoolSettings().max_event_bytes)


def anchor_config(bootstrap: str, on_error: Callable[[Any], None]) -> dict[str, object]:
    """The sender's producer settings plus murmur2_random, the Java-compatible partitioner
    (keys land where the spool puts them), and an error callback."""
    return {
        **sender_producer_config(bootstrap),
        "partitioner": "murmur2_random",
        "error_cb": on_error,
    }


def compared_settings() -> dict[str, object]:
    """A result's settings of both sides, as data: the spool's queue defaults and the
    anchor's producer config (the sender's own, so it states the sender's too)."""
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
