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
