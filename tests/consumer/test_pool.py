"""The worker pool's transfers, with real worker processes.

A part's packed records travel in the worker's hand-off ring of shared memory, and in
the pipe when they do not fit in the room left; either way the worker runs every event
once, in order, and reports it. A replaced worker gets a ring of its own.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from eventspool._core.native import split_keyed
from eventspool.consumer.messages import InRing, PartWire, Progress, SentParts, WorkerDied
from eventspool.consumer.pool import _HANDOFF_BYTES, WorkerPool
from eventspool.consumer.scheduler import Ordering
from eventspool.consumer.settings import RetryPolicy
from tests.consumer.handlers import record_to

TIMEOUT_S = 30.0


def _part(part_id: int, first: int, count: int, value: bytes) -> PartWire:
    messages = [
        Message(topic="t", partition=0, offset=offset, key=b"k", value=value, timestamp=(1, offset))
        for offset in range(first, first + count)
    ]
    (run,) = split_keyed(messages, 1, count, {("t", 0): None}, None)
    ((blob, events),) = run[5]
    assert events == count
    return (part_id, "t", 0, blob, None)


def _pool(out: Path) -> WorkerPool:
    """One plain worker that records each event it runs in `out`."""
    return WorkerPool(
        1,
        functools.partial(record_to, out),
        Ordering.KEY,
        "forkserver",
        concurrency=1,
        retry=RetryPolicy(1, 0.0, 0.0),
    )


def _settle(pool: WorkerPool, events: int) -> None:
    """Collect until the worker has reported `events` settled."""
    settled = 0
    deadline = time.monotonic() + TIMEOUT_S
    while settled < events:
        assert time.monotonic() < deadline, f"{settled} of {events} settled"
        for event in pool.collect(0.1):
            if isinstance(event, Progress):
                settled += event.settled


def _offsets(path: Path) -> list[int]:
    return [int(line.split()[1].rpartition("@")[2]) for line in path.read_text().splitlines()]


def test_parts_in_the_ring_and_one_too_large_for_it_all_run_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[SentParts] = []
    send = Connection.send

    def keep(conn: Connection, message: Any) -> None:
        if isinstance(message, SentParts):
            sent.append(message)
        send(conn, message)

    monkeypatch.setattr(Connection, "send", keep)
    out = tmp_path / "handled"
    pool = _pool(out)
    try:
        large = b"x" * (_HANDOFF_BYTES // 4)  # five of them are more than the ring holds
        parts = [_part(1, 0, 50, b"small"), _part(2, 50, 5, large), _part(3, 55, 50, b"small")]
        pool.send_parts(0, parts, 105)
        pool.send_parts(0, [_part(4, 105, 20, b"small")], 20)
        _settle(pool, 125)
        assert _offsets(out) == list(range(125))
        ways = [type(part[3]) for message in sent for part in message.parts]
        assert ways == [InRing, bytes, InRing, InRing]
    finally:
        pool.stop()


def test_a_replaced_worker_takes_parts_from_a_ring_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "handled"
    pool = _pool(out)
    try:
        pool.send_parts(0, [_part(1, 0, 10, b"before")], 10)
        _settle(pool, 10)
        (pid,) = pool.pids()
        assert pid is not None
        first_ring = pool._workers[0].handoff
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + TIMEOUT_S
        while not any(isinstance(event, WorkerDied) for event in pool.collect(0.1)):
            assert time.monotonic() < deadline, "the death was not reported"
        assert pool._workers[0].handoff is not first_ring
        pool.send_parts(0, [_part(2, 10, 10, b"after")], 10)
        _settle(pool, 10)
        assert _offsets(out) == list(range(20))
    finally:
        pool.stop()
