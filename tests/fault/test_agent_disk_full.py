"""The agent on a full disk: its own status for the refused events, one log line, no traceback.

A real 2 MiB tmpfs holds the spool; the first topic's queue fills most of it, so the
second topic's queue file cannot be reserved. The bootstrap server is a closed port:
with no partition counts, every topic keeps its events in its one pending queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventspool import SpoolFullError
from eventspool.broker import find_free_port
from eventspool.client.sync import Client
from eventspool.testing.agent import AgentProcess
from eventspool.wire.protocol import Status
from tests.agent.conftest import call
from tests.conftest import SmallDiskFactory

pytestmark = pytest.mark.fault

MIB = 1024 * 1024
QUEUES = "[topics.first]\nqueue_bytes = 1048576\n[topics.second]\nqueue_bytes = 1048576\n"


@pytest.fixture
def agent_on_small_disk(tmp_path: Path, small_disk: SmallDiskFactory) -> Iterator[AgentProcess]:
    disk = small_disk(tmp_path / "tmpfs", 2 * MIB)
    home = tmp_path / "agent"
    home.mkdir()
    agent = AgentProcess(
        home,
        f"127.0.0.1:{find_free_port()}",
        QUEUES,
        spool_dir=disk.path / "spool",
        max_event_bytes=4096,
    )
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def test_a_full_disk_is_answered_with_no_space_and_existing_queues_go_on(
    agent_on_small_disk: AgentProcess,
) -> None:
    agent = agent_on_small_disk
    with Client(agent.socket_path) as client:
        accepted = [client.send("first", b"before %d" % i) for i in range(5)]
        for _ in range(50):
            with pytest.raises(SpoolFullError, match="no space left on device"):
                client.send("second", b"needs a new queue file")
        accepted.append(client.send("first", b"after"))
    assert len(set(accepted)) == 6

    status, body = call(agent, "POST", "/v1/topics/second", {"value": "over http"})
    assert status == 507
    assert body["results"][0]["status"] == Status.NO_SPACE.name.lower()

    log = agent.log_tail()
    assert log.count("disk full:") == 1, log
    assert "Traceback" not in log, log
