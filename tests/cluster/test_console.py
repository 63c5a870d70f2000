"""`eventspool broker --brokers N`: a mock cluster steered by typed lines, as a person would."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka.admin import AdminClient


def test_the_console_moves_leaders_and_takes_brokers_down() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "eventspool", "broker", "--brokers", "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None

    def say(line: str) -> str:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(line + "\n")
        process.stdin.flush()
        return process.stdout.readline().strip()

    try:
        bootstrap = process.stdout.readline().strip()
        assert len(bootstrap.split(",")) == 3
        assert say("topic orders 3") == "ok"
        assert say("leader orders 1 none") == "ok"
        assert say("leader orders 2 3") == "ok"
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics("orders", timeout=10)
        leaders = {p: info.leader for p, info in metadata.topics["orders"].partitions.items()}
        assert leaders[1] == -1 and leaders[2] == 3
        assert say("errors produce NOT_LEADER_FOR_PARTITION 45") == "ok"
        assert say("down 3") == "ok"
        assert say("up 3") == "ok"
        assert "unknown request type" in say("errors bogus 1")
        assert "missing arguments" in say("leader orders")
        assert "unknown command" in say("frobnicate")
        process.stdin.write("quit\n")
        process.stdin.flush()
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.wait()
