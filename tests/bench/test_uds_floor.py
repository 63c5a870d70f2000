"""The uds bench's floor for one client shared by 16 threads: its hand-offs through the C
echo server, and the shipping load that runs beside them, against the real broker."""

from __future__ import annotations

import json
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import pytest

import uds
from eventspool.broker import LocalBroker, create_topic
from eventspool.endoffsets import true_end_offsets
from harness.child import Child
from harness.echo import EchoServer, have_compiler


@pytest.mark.skipif(not have_compiler(), reason="no C compiler (cc)")
def test_handoffs_through_the_echo_wake_every_caller(tmp_path: Path) -> None:
    with closing(EchoServer(tmp_path)) as server:
        rate = uds.handoff_echo_rate(4, 0.3, server.socket_path)
    assert rate > 100  # every caller woken after its batch came back, over and over


def test_handoffs_without_an_echo_wake_every_caller_then_raise(tmp_path: Path) -> None:
    """Its batches are round trips to the echo: with none listening the lane cannot
    measure, and says so once its callers are done, instead of leaving them waiting."""
    with pytest.raises(OSError):
        uds.handoff_echo_rate(4, 0.2, tmp_path / "nobody.sock")


def test_the_shipping_load_ships_at_its_rate_until_paused(
    broker: LocalBroker, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap_servers, uds.LOAD_TOPIC, uds.PARTITIONS)
    load = Child.of_script(
        "shipping load",
        uds.__file__,
        ["ship", broker.bootstrap_servers],
        tmp_path / "load.err",
        piped=True,
    )
    try:
        assert load.start().read_line().strip() == "ready", load.stderr_tail()
        load.tell("ship 2000")
        time.sleep(1.0)
        load.tell("pause")
        answer = load.read_line()
        assert answer, load.stderr_tail()
        shipped = json.loads(answer)
        load.stop(10)
    finally:
        load.terminate()
    assert 1000 <= shipped["shipped"] <= 3000, shipped
    assert shipped["shipped"] / shipped["seconds"] == pytest.approx(2000, rel=0.3)
    ends = true_end_offsets(
        {"bootstrap.servers": broker.bootstrap_servers},
        [(uds.LOAD_TOPIC, partition) for partition in range(uds.PARTITIONS)],
    )
    assert sum(ends.values()) == shipped["shipped"] + 1  # and the one that connected it


class _PollsSeen:
    """The real producer, with the timeouts its polls were given noted."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.timeouts: list[float] = []

    def poll(self, timeout: float) -> int:
        self.timeouts.append(timeout)
        return int(self.producer.poll(timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.producer, name)


def test_the_shipping_load_waits_for_its_batches_instead_of_spinning(
    broker: LocalBroker,
) -> None:
    """librdkafka waits in whole milliseconds, so a poll given less does not wait: the
    load used to spin through the last one before each batch, costing it more CPU per
    event than the agent's sender pays, and so understating the floors it loads."""
    topic = f"load-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap_servers, topic, uds.PARTITIONS)
    bare = uds.BareProducer(broker.bootstrap_servers, topic)
    polls = _PollsSeen(bare.producer)
    bare.producer = cast(Any, polls)  # the same producer, its polls noted
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    shipped, seconds = uds.ship_at(bare, 4000, stop)
    timer.join()
    assert shipped / seconds == pytest.approx(4000, rel=0.3)
    waits = [timeout for timeout in polls.timeouts if timeout > 0]  # ship()'s own poll(0)
    assert waits
    assert min(waits) >= uds.POLL_RESOLUTION_S
