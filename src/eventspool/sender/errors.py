"""Which delivery errors are the event's fault (dead-letter it) and which are the world's.

A permanent error would fail again on every retry, so the event goes to the dead-letter
file and its queue keeps flowing. Everything else is retried for as long as it takes.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

PERMANENT_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
    }
)


def is_permanent(error: KafkaError) -> bool:
    return error.code() in PERMANENT_CODES
