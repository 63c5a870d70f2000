"""Exchanges through the agent: configured and runtime ones, binary PUBLISH and HTTP, restarts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from eventspool.broker import LocalBroker
from eventspool.client.aio import AsyncClient
from eventspool.client.sync import Client
from eventspool.errors import InvalidEventError, UnknownExchangeError, UnroutableError
from eventspool.testing.agent import AgentProcess, UnixHTTPConnection
from eventspool.verify import consume_topic
from tests.agent.conftest import AgentFactory
from tests.routing.tutorial import TUTORIAL


def call(agent: AgentProcess, method: str, target: str, body: object = None) -> tuple[int, Any]:
    """One HTTP request to the agent's socket; (status, decoded JSON body)."""
    connection = UnixHTTPConnection(agent.socket_path)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, target, body=payload)
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data.startswith(b"{") else data.decode()
    finally:
        connection.close()


def tutorial_config(topics: dict[str, str]) -> str:
    return f"""
[exchanges.animals]
type = "topic"
alternate_topic = "{topics["unroutable"]}"
bindings = [
  {{ topic = "{topics["Q1"]}", key = "*.orange.*" }},
  {{ topic = "{topics["Q2"]}", key = "*.*.rabbit" }},
  {{ topic = "{topics["Q2"]}", key = "lazy.#" }},
]
"""


def test_the_tutorial_through_every_interface_of_the_agent(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """The blocking client, the asyncio client and HTTP route alike, checked on the broker."""
    topics = {queue: topic_factory(1) for queue in ("Q1", "Q2", "unroutable")}
    agent = agent_factory(tutorial_config(topics))
    agent.start()
    sent: list[tuple[str, str]] = []  # (routing key, event id)
    with Client(agent.socket_path) as client:
        for key in TUTORIAL:
            sent.append((key, client.send(None, b"sync", exchange="animals", routing_key=key)))

    async def publish_all() -> list[str]:
        async with AsyncClient(agent.socket_path) as aclient:
            return await asyncio.gather(
                *(aclient.send(None, b"aio", exchange="animals", routing_key=k) for k in TUTORIAL)
            )

    sent.extend(zip(TUTORIAL, asyncio.run(publish_all()), strict=True))
    events = [{"routing_key": key, "value": "http", "key": "k"} for key in TUTORIAL]
    status, answer = call(agent, "POST", "/v1/exchanges/animals", {"events": events})
    assert status == 200, answer
    sent.extend(zip(TUTORIAL, [r["event_id"] for r in answer["results"]], strict=True))

    last = {}
    with Client(agent.socket_path) as client:
        for queue, topic in topics.items():
            last[queue] = client.send(topic, b"last")
        stats = client.stats()
    assert stats["exchanges"]["animals"]["routed"] == 18
    assert stats["exchanges"]["animals"]["unroutable_alternate"] == 9
    seen = {
        queue: consume_topic(broker.bootstrap_servers, topic, last[queue])
        for queue, topic in topics.items()
    }
    for key, event_id in sent:
        reached = Counter({queue: seen[queue][event_id] for queue in seen if seen[queue][event_id]})
        assert reached == Counter(dict.fromkeys(TUTORIAL[key], 1)), key
    status, metrics = call(agent, "GET", "/metrics")
    assert 'eventspool_events_unroutable_total{exchange="animals",outcome="alternate"} 9.0' in (
        metrics
    )


def test_errors_of_publishing(agent_factory: AgentFactory) -> None:
    agent = agent_factory(
        '[exchanges.strict]\ntype = "direct"\nbindings = [{topic = "t", key = "k"}]\n'
    )
    agent.start()
    with Client(agent.socket_path) as client:
        with pytest.raises(UnknownExchangeError, match="'nope' is not declared"):
            client.send(None, b"v", exchange="nope", routing_key="k")
        with pytest.raises(UnroutableError, match="matches no binding"):
            client.send(None, b"v", exchange="strict", routing_key="other")
        with pytest.raises(InvalidEventError, match="give one of them"):
            client.send("t", b"v", exchange="strict")
        with pytest.raises(InvalidEventError, match="routing_key of 256 bytes"):
            client.send(None, b"v", exchange="strict", routing_key="k" * 256)
        assert len(client.send(None, b"v", exchange="strict", routing_key="k")) == 36
        stats = client.stats()["exchanges"]["strict"]
    assert (stats["routed"], stats["unroutable_refused"]) == (1, 1)
    status, answer = call(agent, "POST", "/v1/exchanges/strict", {"routing_key": "other"})
    assert status == 422
    assert answer["results"][0]["status"] == "unroutable"
    status, answer = call(agent, "POST", "/v1/exchanges/nope", {"value": "v"})
    assert (status, answer["results"][0]["status"]) == (404, "unknown_exchange")
    status, answer = call(agent, "POST", "/v1/exchanges/strict", {"routing_key": 5})
    assert (status, answer["error"]) == (400, "event 0: routing_key must be a string")
    status, answer = call(agent, "POST", "/v1/topics/t", {"value": "v", "routing_key": "k"})
    assert status == 400
    assert "routing_key" in answer["error"]


def test_runtime_declarations_over_http_survive_a_sigkill(
    agent_factory: AgentFactory,
) -> None:
    """Declared, answered, killed: the restarted agent still routes through the exchange."""
    agent = agent_factory('[exchanges.configured]\ntype = "fanout"\nbindings = [{topic = "c"}]\n')
    agent.start()
    bindings = [{"topic": "orders", "key": "created"}]
    declaration: dict[str, object] = {
        "type": "direct",
        "bindings": bindings,
        "alternate_topic": "orders-unroutable",
    }
    status, created = call(agent, "PUT", "/v1/exchanges/orders", declaration)
    assert status == 201, created
    assert created == {
        "name": "orders",
        **declaration,
        "source": "runtime",
        "routed": 0,
        "unroutable_alternate": 0,
        "unroutable_refused": 0,
    }
    bindings.append({"topic": "audit", "key": "created"})
    assert call(agent, "PUT", "/v1/exchanges/orders", declaration)[0] == 200
    status, answer = call(agent, "PUT", "/v1/exchanges/configured", {"type": "topic"})
    assert (status, "change it there" in answer["error"]) == (409, True)
    status, answer = call(agent, "PUT", "/v1/exchanges/bad", {"type": "headers"})
    assert (status, "not one of" in answer["error"]) == (400, True)
    status, answer = call(agent, "PUT", "/v1/exchanges/bad", {"type": "topic", "x": 1})
    assert (status, "unknown fields x" in answer["error"]) == (400, True)
    assert call(agent, "PUT", "/v1/exchanges/doomed", {"type": "fanout"})[0] == 201
    assert call(agent, "DELETE", "/v1/exchanges/doomed") == (200, {"deleted": "doomed"})
    assert call(agent, "DELETE", "/v1/exchanges/doomed")[0] == 404
    assert call(agent, "DELETE", "/v1/exchanges/configured")[0] == 409
    assert call(agent, "GET", "/v1/exchanges/doomed")[0] == 404
    assert call(agent, "PATCH", "/v1/exchanges/orders")[0] == 405

    assert agent.process is not None
    os.kill(agent.process.pid, signal.SIGKILL)
    agent.process.wait()
    agent.start(wait=False)
    deadline = time.monotonic() + 20
    while True:
        try:
            status, listing = call(agent, "GET", "/v1/exchanges")
            break
        except OSError:
            assert time.monotonic() < deadline, agent.log.read_text()
            time.sleep(0.05)
    assert status == 200
    assert [(e["name"], e["source"]) for e in listing["exchanges"]] == [
        ("configured", "config"),
        ("orders", "runtime"),
    ]
    assert listing["exchanges"][1]["bindings"] == bindings
    with Client(agent.socket_path) as client:
        client.send(None, b"o", exchange="orders", routing_key="created")
        queues = {queue["topic"] for queue in client.stats()["queues"]}
    assert {"orders", "audit"} <= queues
