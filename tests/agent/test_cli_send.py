"""`eventspool send` through a real agent process: plain lines and --json event objects,
which mean what they mean over HTTP (text values, never a Python repr)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from eventspool.broker import LocalBroker
from eventspool.verify import consume_event_ids
from tests.agent.conftest import AgentFactory


def _send(socket_path: str, topic: str, lines: list[str], *flags: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "eventspool", "send", topic, "--socket", socket_path, *flags],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_json_lines_send_text_and_refuse_what_http_refuses(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start_answering()
    lines = [
        json.dumps({"value": "plain text", "key": "user-1", "headers": {"source": "cli"}}),
        json.dumps({"value": {"a": 1}}),
        json.dumps({"value": True}),
        json.dumps({"value": 1}),
        json.dumps([1, 2]),
        "not json",
        json.dumps({"value_b64": "AAEC"}),
    ]
    done = _send(str(agent.socket_path), topic, lines, "--json")
    assert done.returncode == 1
    ids = done.stdout.split()
    assert len(ids) == 2
    errors = done.stderr.splitlines()
    assert [line.split(":")[0] for line in errors[:-1]] == [
        "line 2",
        "line 3",
        "line 4",
        "line 5",
        "line 6",
    ]
    assert "value must be a string" in errors[0]
    assert errors[-1] == "sent 2, failed 5"
    found: dict[str, tuple[bytes | None, bytes | None, list[Any]]] = {}

    def record(message: Any) -> str:
        event_id = dict(message.headers())["event_id"].decode()
        found[event_id] = (message.key(), message.value(), message.headers())
        return str(event_id)

    consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60, id_of=record)
    key, value, headers = found[ids[0]]
    assert (key, value) == (b"user-1", b"plain text")
    assert ("source", b"cli") in headers
    assert found[ids[1]][1] == b"\x00\x01\x02"
