"""The blocking Client checks its arguments as Spool.send() does, before batching.

A bad argument must fail its own call: were it let through to the batch written for
every waiting thread, the others' sends would fail with it. The errors come before any
connection, so no agent is needed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from eventspool import InvalidEventError, InvalidTopicError
from eventspool.client.sync import Client


@pytest.mark.parametrize(
    ("topic", "key", "error"),
    [
        (None, None, InvalidTopicError),
        ("caf\udc80", None, InvalidTopicError),
        ("x" * 70_000, None, InvalidTopicError),
        ("fine", 7, InvalidEventError),
        ("fine", "\udc80", InvalidEventError),
    ],
    ids=["None topic", "surrogate topic", "70k topic", "int key", "surrogate key"],
)
def test_arguments_the_wire_cannot_carry_raise_like_spool_send(
    tmp_path: Path, topic: Any, key: Any, error: type[Exception]
) -> None:
    with Client(tmp_path / "nobody.sock", timeout=0.2) as client, pytest.raises(error):
        client.send(topic, b"x", key)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"topic": "t", "exchange": "x"}, "give one of them"),
        ({"exchange": 5}, "exchange must be a str"),
        ({"routing_key": b"k"}, "routing_key must be a str"),
        ({"routing_key": "k" * 256}, "routing_key of 256 bytes"),
        ({"routing_key": "\udc80"}, "routing_key is not encodable"),
        ({"key": 7}, "key for exchange 'x' must be bytes"),
    ],
)
def test_publish_arguments_are_checked_before_any_connection(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    call: dict[str, Any] = {"topic": None, "value": b"x", "exchange": "x", **arguments}
    with (
        Client(tmp_path / "nobody.sock", timeout=0.2) as client,
        pytest.raises(InvalidEventError, match=message),
    ):
        client.send(**call)


def test_a_bad_argument_in_one_thread_never_strands_the_others(tmp_path: Path) -> None:
    """With no agent, every thread's send ends (with an error), none spins forever."""
    client = Client(tmp_path / "nobody.sock", timeout=0.3)
    outcomes: list[str] = []

    def good() -> None:
        try:
            client.send("fine", b"x")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=good) for _ in range(8)]
    for thread in threads:
        thread.start()
    with pytest.raises(InvalidEventError):
        client.send("fine", b"x", 7)  # type: ignore[arg-type]
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert outcomes == ["AgentError"] * 8
