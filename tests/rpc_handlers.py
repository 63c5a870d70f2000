"""Responder functions that the RPC tests run in worker processes."""

from __future__ import annotations

from eventspool.consumer import Record
from eventspool.rpc import responder


def upper_tagged(tag: str, record: Record) -> bytes:
    """The request upper-cased and the answering member's tag, so a test can check both
    the answer and who gave it."""
    return (record.value or b"").upper() + b"|" + tag.encode()


def refuse(record: Record) -> bytes:
    raise LookupError(f"no order {(record.value or b'').decode()}")


@responder("127.0.0.1:9")
def decorated(record: Record) -> bytes:
    return b"decorated " + (record.value or b"")
